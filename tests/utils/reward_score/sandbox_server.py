"""A Sandbox Fusion ``run_code`` server for tests: the API's request and response shape over HTTP on localhost, each
program run with ``python -c`` in a subprocess (what a Sandbox Fusion deployment does in its containers)."""

import contextlib
import json
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class _SandboxHandler(BaseHTTPRequestHandler):
    """POST run_code: Sandbox Fusion's request and response shape, the program run with ``python -c``."""

    in_flight = 0
    most_in_flight = 0
    lock = threading.Lock()
    requests: list = []
    fail = False

    def do_POST(self):  # noqa: N802 -- http.server's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        cls = type(self)
        with cls.lock:
            cls.requests.append(body)
            cls.in_flight += 1
            cls.most_in_flight = max(cls.most_in_flight, cls.in_flight)
        try:
            time.sleep(0.05)  # long enough for concurrent requests to overlap
            if cls.fail:
                reply = {"status": "SandboxError", "message": "no runner available", "run_result": None}
            else:
                proc = subprocess.run([sys.executable, "-c", body["code"]], input=body["stdin"], text=True,
                                      capture_output=True, timeout=body["run_timeout"])
                reply = {"status": "Success" if proc.returncode == 0 else "Failed", "compile_result": None,
                         "run_result": {"status": "Finished", "stdout": proc.stdout, "stderr": proc.stderr,
                                        "return_code": proc.returncode, "execution_time": 0.01}}
        finally:
            with cls.lock:
                cls.in_flight -= 1
        data = json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@contextlib.contextmanager
def running_sandbox():
    """``(url, handler class)``: the handler records ``requests`` and the most requests ``in_flight`` at once; set
    ``handler.fail = True`` to answer every request with a SandboxError."""
    handler = type("Handler", (_SandboxHandler,), {"requests": [], "in_flight": 0, "most_in_flight": 0,
                                                    "lock": threading.Lock(), "fail": False})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/run_code", handler
    finally:
        server.shutdown()
        server.server_close()
