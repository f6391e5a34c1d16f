"""Ray nodes started by tests with `ray start`, each in its own process session so that a test can stop exactly
its nodes (`ray stop` would stop every Ray instance of this user on the machine)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RAY = str(Path(sys.executable).with_name("ray"))


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def session_pids(sids: list[int]) -> list[int]:
    out = subprocess.run(["ps", "-eo", "pid=,sid=,stat="], capture_output=True, text=True, check=True).stdout
    return [int(p) for p, s, st in (line.split() for line in out.splitlines()) if int(s) in sids and "Z" not in st]


def kill_sessions(sids: list[int], grace: float = 15.0) -> None:
    """SIGTERM every process of these sessions, SIGKILL what is left after ``grace`` seconds."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        for pid in session_pids(sids):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.time() + wait
        while session_pids(sids) and time.time() < deadline:
            time.sleep(0.5)


def ray_start(args: list[str], env: dict, log: Path, sids: list[int], attempts: int = 1) -> None:
    """Run `ray start ...` in a new process session (its daemons inherit it, so the test can stop exactly them).
    A node whose agents start too slowly on a busy machine makes `ray start` time out; it is retried."""
    for attempt in range(attempts):
        with open(log, "a") as f:
            proc = subprocess.Popen([RAY, "start", *args, "--disable-usage-stats"], env=env, stdout=f,
                                    stderr=subprocess.STDOUT, start_new_session=True)
            sids.append(proc.pid)
            rc = proc.wait(timeout=240)
        if rc == 0:
            return
        kill_sessions([proc.pid], grace=5.0)
    raise AssertionError(f"ray start {' '.join(args[:2])} failed {attempts} times:\n" + log.read_text()[-4000:])


def node_ports_args(ports: list[int]) -> list[str]:
    """Explicit agent ports (4) for a node, so that two nodes on one machine do not collide."""
    return ["--dashboard-agent-listen-port", str(ports[0]), "--dashboard-agent-grpc-port", str(ports[1]),
            "--metrics-export-port", str(ports[2]), "--runtime-env-agent-port", str(ports[3])]


def start_local_head(env: dict, log: Path, num_cpus: int) -> tuple[str, list[int]]:
    """One head node on 127.0.0.1 without a dashboard, in a private temp dir (so that a plain ``ray.init()`` in
    another test does not find it). Returns (address, process sessions to kill)."""
    temp = tempfile.mkdtemp(prefix="rh", dir="/tmp")  # short: Ray's unix socket paths have a length limit
    gcs, client, *agent = free_ports(6)
    sids: list[int] = []
    ray_start(["--head", "--node-ip-address", "127.0.0.1", "--port", str(gcs), "--num-cpus", str(num_cpus),
               "--num-gpus", "0", "--include-dashboard", "false", "--ray-client-server-port", str(client),
               "--temp-dir", temp, *node_ports_args(agent)], env, log, sids, attempts=2)
    return f"127.0.0.1:{gcs}", sids


def ray_was_used(log: str) -> bool:
    """Whether a run's output shows that it started a Ray instance or joined one (a config error must do neither)."""
    return "Started a local Ray instance" in log or "Connecting to existing Ray cluster" in log
