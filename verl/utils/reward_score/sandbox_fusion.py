"""Code rewards: run the response's program on the row's test cases and score the share that pass.

The data sources ``codecontests``, ``apps``, ``codeforces`` and ``taco`` use it (as in verl). Their
``reward_model.ground_truth`` holds the test cases, a JSON string or a mapping:

- standard input / output: ``{"inputs": ["1 2\\n", ...], "outputs": ["3\\n", ...]}``: the program reads a case's
  input on stdin; it passes when its stdout equals the expected output (whitespace at line ends and trailing
  blank lines ignored);
- call-based: ``{"fn_name": "add", "inputs": [[1, 2], ...], "outputs": [3, ...]}``: the function ``add`` the
  program defines is called with each input's arguments; it passes when the return value equals the output.

The program is the last fenced code block of the response (the whole response when it has none).

Where it runs:

- ``reward_model.sandbox_fusion.url`` set: on that `Sandbox Fusion <https://github.com/bytedance/SandboxFusion>`_
  server (its ``run_code`` API: ``{"code", "stdin", "language", "run_timeout", "memory_limit_MB", ...}`` in,
  ``{"status", "run_result": {"status", "stdout", "return_code"}}`` out), at most ``max_concurrent`` requests at a
  time per process, ``memory_limit_mb`` per run;
- no URL: in a fresh local subprocess with :mod:`verl.utils.python_sandbox`'s isolation (temporary directory,
  memory and CPU limits, a wall-clock timeout, no network, an audit hook refusing writes outside that directory
  and new processes): a guard against accidents of a policy under training, not a security boundary. Use a
  Sandbox Fusion server for untrusted workloads.

``compute_score`` returns ``{"score": passed / total, "passed": ..., "total": ...}`` (``continuous``, verl's
default for these data sources) or 1.0 only when every case passes.
"""

from __future__ import annotations

import json
import re
import signal
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any, Optional

from verl.utils.python_sandbox import run_python_sync

__all__ = ["CODE_DATA_SOURCES", "compute_score", "extract_code", "parse_test_cases", "run_program", "RunResult"]

CODE_DATA_SOURCES = ("codecontests", "apps", "codeforces", "taco")
DEFAULT_TIMEOUT_S = 10.0
_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[ \t]*\n(.*?)```", re.DOTALL)
# the program text run for a call-based case: the response's code, then a call of fn_name with the case's
# arguments (JSON on stdin), its return value printed as JSON
_CALL_HARNESS = """
import json as _json, sys as _sys
_args = _json.loads(_sys.stdin.read())
_fn = globals().get({fn_name!r})
if _fn is None:
    for _value in list(globals().values()):  # a LeetCode-style class Solution with the method
        if isinstance(_value, type) and hasattr(_value, {fn_name!r}):
            _fn = getattr(_value(), {fn_name!r})
            break
if _fn is None:
    raise SystemExit("no function named " + {fn_name!r})
_result = _fn(*_args) if isinstance(_args, list) else _fn(_args)
print(_json.dumps(_result))
"""


@dataclass(frozen=True)
class RunResult:
    """One run of a program: ``status`` is ``ok``, ``runtime_error``, ``timeout`` or ``sandbox_error``."""

    status: str
    stdout: str = ""
    stderr: str = ""


def extract_code(solution_str: str) -> str:
    """The last fenced code block of a response (any language tag), or the whole response without one."""
    blocks = _FENCE.findall(solution_str or "")
    return blocks[-1][1] if blocks else (solution_str or "")


def parse_test_cases(ground_truth: Any) -> dict:
    """``{"inputs": [...], "outputs": [...], "fn_name": str | None}`` from a JSON string or mapping; a malformed
    ground truth raises ValueError saying what is expected."""
    cases = json.loads(ground_truth) if isinstance(ground_truth, (str, bytes)) else ground_truth
    if not isinstance(cases, dict) or not isinstance(cases.get("inputs"), list) \
            or not isinstance(cases.get("outputs"), list):
        raise ValueError("code test cases must be a mapping (or its JSON) with lists 'inputs' and 'outputs' "
                         f"(and 'fn_name' for call-based problems), got {str(ground_truth)[:120]!r}")
    if len(cases["inputs"]) != len(cases["outputs"]):
        raise ValueError(f"code test cases: {len(cases['inputs'])} inputs but {len(cases['outputs'])} outputs")
    return {"inputs": cases["inputs"], "outputs": cases["outputs"], "fn_name": cases.get("fn_name") or None}


# ------------------------------------------------------------------------------------------------ runners

def _run_local(code: str, stdin: str, timeout: float, memory_limit_mb: int) -> RunResult:
    # unlimited output: a program's whole answer is compared, not shown to a model
    result = run_python_sync(code, timeout=timeout, memory_limit_mb=memory_limit_mb, max_output_chars=1 << 30,
                             stdin=stdin)
    if result["timed_out"] or result["returncode"] == -signal.SIGXCPU:  # wall clock or the CPU-seconds limit
        return RunResult("timeout", result["stdout"], result["stderr"])
    return RunResult("ok" if result["returncode"] == 0 else "runtime_error", result["stdout"], result["stderr"])


_SEMAPHORES: dict[tuple[str, int], threading.BoundedSemaphore] = {}
_SEMAPHORES_LOCK = threading.Lock()


def _semaphore(url: str, max_concurrent: int) -> threading.BoundedSemaphore:
    """One limit per server and process (a reward manager's worker processes each hold their own)."""
    with _SEMAPHORES_LOCK:
        return _SEMAPHORES.setdefault((url, max_concurrent), threading.BoundedSemaphore(max_concurrent))


def _run_sandbox(url: str, code: str, stdin: str, timeout: float, memory_limit_mb: int, max_concurrent: int,
                 semaphore: Any = None, language: str = "python") -> RunResult:
    payload = json.dumps({"code": code, "stdin": stdin, "language": language, "compile_timeout": timeout,
                          "run_timeout": timeout, "memory_limit_MB": memory_limit_mb, "files": {},
                          "fetch_files": []}).encode()
    request = urllib.request.Request(url, data=payload, method="POST",
                                     headers={"Content-Type": "application/json", "Accept": "application/json"})
    with semaphore if semaphore is not None else _semaphore(url, max_concurrent):
        try:
            with urllib.request.urlopen(request, timeout=timeout + 30) as response:
                body = json.loads(response.read().decode())
        except (urllib.error.URLError, OSError, ValueError) as err:
            return RunResult("sandbox_error", stderr=f"reward_model.sandbox_fusion.url={url}: {err}")
    run = body.get("run_result") or {}
    if body.get("status") == "SandboxError" or not run:
        return RunResult("sandbox_error", stderr=str(body.get("message") or body)[:500])
    if run.get("status") == "TimeLimitExceeded":
        return RunResult("timeout", run.get("stdout") or "", run.get("stderr") or "")
    ok = run.get("status") == "Finished" and run.get("return_code") == 0
    return RunResult("ok" if ok else "runtime_error", run.get("stdout") or "", run.get("stderr") or "")


def run_program(code: str, stdin: str = "", *, sandbox_url: Optional[str] = None,
                timeout: float = DEFAULT_TIMEOUT_S, memory_limit_mb: int = 1024, max_concurrent: int = 64,
                semaphore: Any = None) -> RunResult:
    """Run a Python program on ``stdin``: on the Sandbox Fusion server at ``sandbox_url`` (at most
    ``max_concurrent`` requests at a time in this process, or under the given ``semaphore``), else locally."""
    if sandbox_url:
        return _run_sandbox(sandbox_url, code, stdin, timeout, memory_limit_mb, max_concurrent, semaphore)
    return _run_local(code, stdin, timeout, memory_limit_mb)


# ------------------------------------------------------------------------------------------------ scoring

def _same_output(got: str, expected: Any) -> bool:
    def lines(text: str) -> list[str]:
        out = [line.rstrip() for line in str(text).replace("\r\n", "\n").split("\n")]
        while out and not out[-1]:
            out.pop()
        return out

    return lines(got) == lines(expected)


def _same_value(got_stdout: str, expected: Any) -> bool:
    try:
        got = json.loads(got_stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return False
    if isinstance(expected, list) and len(expected) == 1 and got != expected:
        expected = expected[0]  # APPS stores call-based outputs wrapped in a list
    return got == expected or (isinstance(got, list) and isinstance(expected, tuple) and got == list(expected))


def compute_score(solution_str: str, ground_truth: Any, *, sandbox_url: Optional[str] = None,
                  memory_limit_mb: int = 1024, max_concurrent: int = 64, timeout: float = DEFAULT_TIMEOUT_S,
                  continuous: bool = True, max_cases: Optional[int] = None, semaphore: Any = None) -> dict:
    """Score a response on its test cases (module docstring). ``max_cases`` runs only the first N cases."""
    cases = parse_test_cases(ground_truth)
    code = extract_code(solution_str)
    pairs = list(zip(cases["inputs"], cases["outputs"]))[:max_cases]
    passed, statuses = 0, []
    for case_input, expected in pairs:
        if cases["fn_name"]:
            program = code + "\n" + _CALL_HARNESS.format(fn_name=cases["fn_name"])
            stdin = json.dumps(case_input)
        else:
            program, stdin = code, case_input if isinstance(case_input, str) else str(case_input)
        result = run_program(program, stdin, sandbox_url=sandbox_url, timeout=timeout,
                             memory_limit_mb=memory_limit_mb, max_concurrent=max_concurrent, semaphore=semaphore)
        ok = result.status == "ok" and (_same_value(result.stdout, expected) if cases["fn_name"]
                                        else _same_output(result.stdout, expected))
        passed += ok
        statuses.append("passed" if ok else ("wrong_answer" if result.status == "ok" else result.status))
        if not continuous and not ok:
            break  # all or nothing: the first failure decides
    total = len(pairs)
    score = (passed / total if continuous else float(passed == total)) if total else 0.0
    return {"score": float(score), "passed": passed, "total": total,
            "sandbox_errors": statuses.count("sandbox_error")}
