"""Shipped tools and the tool config loader: the calculator's safe evaluation, the sandbox's isolation (no writes
outside its temp dir, no network, limits, temp dir removed), BM25 retrieval, and config errors."""

import asyncio
import os
import socket
import textwrap
import threading

import pytest

from verl.tools.calculator_tool import CalculatorError, CalculatorTool, safe_eval
from verl.tools.sandbox_tool import PythonSandboxTool, network_namespace_available, run_python
from verl.tools.search_tool import BM25SearchTool
from verl.tools.utils.tool_registry import ToolConfigError, initialize_tools_from_config, load_tool_config


def test_calculator_values():
    assert safe_eval("123*456") == 56088
    assert safe_eval("(2 + 3) * -4 // 3") == -7
    assert safe_eval("2 ** 10 % 1000") == 24
    assert safe_eval("sqrt(16) + max(1, 7)") == 11.0
    assert safe_eval("7 / 2") == 3.5


@pytest.mark.parametrize("expr", ["__import__('os').system('true')", "open('x')", "a + 1", "[1, 2]", "2 ** 100000",
                                  "10 ** 99 * 10 ** 99", "1 / 0", "(lambda: 1)()", "True + 1", "'a' * 3", "1 +"])
def test_calculator_refuses(expr):
    with pytest.raises(CalculatorError):
        safe_eval(expr)


def test_calculator_tool_reward():
    tool = CalculatorTool({}, None)

    async def go():
        iid, _ = await tool.create(create_kwargs={"ground_truth": "12"})
        resp, reward, _ = await tool.execute(iid, {"expression": "3*4"})
        bad, r2, m2 = await tool.execute(iid, {"expression": "x"})
        return resp.text, reward, bad.text, m2, await tool.calc_reward(iid)

    text, reward, bad, m2, final = asyncio.run(go())
    assert (text, reward, final) == ("12", 1.0, 1.0)
    assert bad.startswith("Error:") and m2["error"] == 1


def _listen():
    """A TCP server on loopback that records whether anything connected."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    srv.settimeout(3)
    hits = []

    def accept():
        try:
            conn, _ = srv.accept()
            hits.append(1)
            conn.close()
        except OSError:
            pass

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    return srv, srv.getsockname()[1], hits, t


@pytest.mark.parametrize("isolate_network", [True, False])
def test_sandbox_has_no_network(isolate_network):
    if isolate_network and not network_namespace_available():
        pytest.skip("unprivileged network namespaces are not available on this machine")
    srv, port, hits, t = _listen()
    code = ("import socket\n"
            f"s = socket.create_connection(('127.0.0.1', {port}), timeout=2)\nprint('CONNECTED')")
    # isolate_network=False: the audit hook alone must stop it; True: the namespace (and the hook) must
    result = asyncio.run(run_python(code, timeout=5, isolate_network=isolate_network))
    t.join(timeout=3)
    srv.close()
    assert "CONNECTED" not in result["stdout"] and not hits
    assert result["returncode"] != 0


def test_sandbox_namespace_alone_blocks_network():
    """Without the audit hook (raw _socket, which the hook also refuses), the namespace has no route out."""
    if not network_namespace_available():
        pytest.skip("unprivileged network namespaces are not available on this machine")
    import subprocess
    import shutil
    import sys

    srv, port, hits, t = _listen()
    code = (f"import socket; s = socket.create_connection(('127.0.0.1', {port}), timeout=2); print('CONNECTED')")
    proc = subprocess.run([shutil.which("unshare"), "--user", "--net", "--map-root-user", sys.executable, "-c", code],
                          capture_output=True, text=True, timeout=20)
    t.join(timeout=3)
    srv.close()
    assert "CONNECTED" not in proc.stdout and not hits and proc.returncode != 0


def test_sandbox_cannot_write_outside_and_cleans_up(tmp_path):
    target = tmp_path / "escape.txt"
    code = textwrap.dedent(f"""
        import os, shutil
        open('inside.txt', 'w').write('ok')
        print(open('inside.txt').read())
        for attempt in (lambda: open({str(target)!r}, 'w'),
                        lambda: os.open({str(target)!r}, os.O_WRONLY | os.O_CREAT),
                        lambda: os.rename('inside.txt', {str(target)!r}),
                        lambda: os.mkdir({str(tmp_path / 'dir')!r}),
                        lambda: os.remove({str(tmp_path / 'keep.txt')!r}),
                        lambda: shutil.copyfile('inside.txt', {str(target)!r}),
                        lambda: os.system('touch {target}'),
                        lambda: __import__('subprocess').run(['touch', {str(target)!r}]),
                        lambda: __import__('ctypes').CDLL(None)):
            try:
                attempt()
                print('ESCAPED')
            except (PermissionError, OSError) as exc:
                print('blocked', type(exc).__name__)
    """)
    (tmp_path / "keep.txt").write_text("keep")
    result = asyncio.run(run_python(code, timeout=10))
    assert result["stdout"].startswith("ok\n"), result
    assert "ESCAPED" not in result["stdout"] and result["stdout"].count("blocked") == 9, result
    assert not target.exists() and (tmp_path / "keep.txt").exists() and not (tmp_path / "dir").exists()
    assert not os.path.exists(result["sandbox_dir"])


def test_sandbox_limits():
    slow = asyncio.run(run_python("while True: pass", timeout=1.0))
    assert slow["timed_out"] and not os.path.exists(slow["sandbox_dir"])
    big = asyncio.run(run_python("x = bytearray(3 * 1024 ** 3)\nprint('ALLOCATED')", memory_limit_mb=256))
    assert "MemoryError" in big["stderr"] and "ALLOCATED" not in big["stdout"]
    loud = asyncio.run(run_python("print('x' * 100000)", max_output_chars=100))
    assert len(loud["stdout"]) < 200 and "output cut" in loud["stdout"]


def test_sandbox_tool_reports_errors():
    tool = PythonSandboxTool({"timeout": 2.0})
    resp, _, metrics = asyncio.run(tool.execute("i", {"code": "print(6*7)"}))
    assert resp.text == "42" and metrics["error"] == 0
    resp, _, metrics = asyncio.run(tool.execute("i", {"code": "1/0"}))
    assert "ZeroDivisionError" in resp.text and metrics["error"] == 1
    resp, _, metrics = asyncio.run(tool.execute("i", {"code": "import time; time.sleep(30)"}))
    assert "was stopped" in resp.text and metrics["error"] == 1


def test_bm25_search(tmp_path):
    corpus = tmp_path / "docs.jsonl"
    corpus.write_text('{"title": "Paris", "text": "Paris is the capital of France."}\n'
                      '{"title": "Berlin", "text": "Berlin is the capital of Germany."}\n'
                      '{"text": "Bananas are yellow fruit rich in potassium."}\n')
    tool = BM25SearchTool({"corpus_path": str(corpus), "top_k": 2})
    hits = tool.search("capital of Germany")
    assert hits[0][0] == 1 and hits[0][1] > hits[1][1] > 0
    resp, _, _ = asyncio.run(tool.execute("i", {"query": "yellow fruit"}))
    assert resp.text.startswith("[1] Bananas")
    resp, _, _ = asyncio.run(tool.execute("i", {"query": "zebra"}))
    assert resp.text == "No results."


def _write(tmp_path, text):
    p = tmp_path / "tools.yaml"
    p.write_text(textwrap.dedent(text))
    return str(p)


def test_tool_config_loads_and_errors(tmp_path):
    good = _write(tmp_path, """
        tools:
          - class_name: verl.tools.calculator_tool.CalculatorTool
            config: {type: native}
            tool_schema:
              type: function
              function:
                name: calc
                description: arithmetic
                parameters: {type: object, properties: {expression: {type: string}}, required: [expression]}
        """)
    tools = initialize_tools_from_config(good)
    assert [t.name for t in tools] == ["calc"]
    bad_cases = {
        "tools:\n  - config: {type: native}\n": "has no class_name",
        "tools:\n  - class_name: verl.tools.calculator_tool.CalculatorTool\n    config: {type: mcp}\n": "only native",
        "nothing: 1\n": "top-level 'tools:' list",
        "tools:\n  - class_name: verl.tools.calculator_tool.CalculatorTool\n    tool_schema: {type: function}\n":
            "not an OpenAI function schema",
    }
    for text, message in bad_cases.items():
        with pytest.raises(ToolConfigError, match=message):
            load_tool_config(_write(tmp_path, text))
    with pytest.raises(ToolConfigError, match="no such file"):
        load_tool_config(str(tmp_path / "missing.yaml"))
    with pytest.raises(ToolConfigError, match="cannot import"):
        initialize_tools_from_config(_write(tmp_path, "tools:\n  - class_name: no_such_pkg.Tool\n"))
    with pytest.raises(ToolConfigError, match="not a BaseTool"):
        initialize_tools_from_config(_write(tmp_path, "tools:\n  - class_name: os.path.join\n"))
