"""Code rewards (codecontests / apps / codeforces / taco): programs really run, locally and through a Sandbox Fusion
``run_code`` server (``sandbox_server.py``: that API over HTTP, each program run in a subprocess)."""

import json
import threading
import time

import pytest

from tests.utils.reward_score.sandbox_server import running_sandbox
from verl.utils.reward_score import default_compute_score
from verl.utils.reward_score.sandbox_fusion import compute_score, extract_code, parse_test_cases, run_program

ADD = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"
ADD_WRONG_ON_NEGATIVES = "```python\na, b = map(int, input().split())\nprint(abs(a) + abs(b))\n```"
STDIO_CASES = json.dumps({"inputs": ["1 2\n", "-3 1\n", "10 20\n", "-1 -1\n"], "outputs": ["3\n", "-2\n", "30", "-2\n"]})
CALL_CASES = {"fn_name": "add", "inputs": [[1, 2], [5, -5]], "outputs": [3, 0]}


def test_the_last_code_block_is_the_program():
    text = "Plan:\n```\nnot this\n```\nFinal:\n```python\nprint(1)\n```\nDone."
    assert extract_code(text) == "print(1)\n"
    assert extract_code("print(2)") == "print(2)"  # no fence: the whole response


def test_malformed_test_cases_are_named():
    with pytest.raises(ValueError, match="lists 'inputs' and 'outputs'"):
        parse_test_cases('{"input": [1]}')
    with pytest.raises(ValueError, match="2 inputs but 1 outputs"):
        parse_test_cases({"inputs": ["1", "2"], "outputs": ["1"]})


def test_local_runs_score_the_share_of_cases_passed():
    assert compute_score(ADD, STDIO_CASES)["score"] == 1.0  # "30" vs "30\n": trailing newline ignored
    partial = compute_score(ADD_WRONG_ON_NEGATIVES, STDIO_CASES)
    assert (partial["score"], partial["passed"], partial["total"]) == (0.5, 2, 4)
    assert compute_score(ADD_WRONG_ON_NEGATIVES, STDIO_CASES, continuous=False)["score"] == 0.0
    assert compute_score("```python\nraise SystemExit(3)\n```", STDIO_CASES)["score"] == 0.0
    # the data sources' scorer is this one
    assert default_compute_score("codecontests", ADD, STDIO_CASES)["score"] == 1.0
    assert default_compute_score("apps", ADD_WRONG_ON_NEGATIVES, STDIO_CASES)["score"] == 0.5


def test_call_based_cases_call_the_named_function():
    assert compute_score("```python\ndef add(a, b):\n    return a + b\n```", CALL_CASES)["score"] == 1.0
    cls = "```python\nclass Solution:\n    def add(self, a, b):\n        return a - b\n```"
    assert compute_score(cls, CALL_CASES)["score"] == 0.0  # 1-2 != 3 and 5+5 != 0
    assert compute_score("```python\ndef sub(a, b):\n    return a - b\n```", CALL_CASES)["score"] == 0.0


def test_a_program_that_never_ends_is_stopped():
    start = time.perf_counter()
    result = run_program("while True:\n    pass\n", timeout=1.0)
    assert result.status == "timeout" and time.perf_counter() - start < 10


@pytest.fixture
def sandbox():
    with running_sandbox() as (url, handler):
        yield url, handler


def test_the_sandbox_server_runs_the_programs(sandbox):
    url, handler = sandbox
    got = compute_score(ADD_WRONG_ON_NEGATIVES, STDIO_CASES, sandbox_url=url, memory_limit_mb=256)
    assert (got["score"], got["sandbox_errors"]) == (0.5, 0)
    assert len(handler.requests) == 4
    sent = handler.requests[0]
    assert sent["language"] == "python" and sent["memory_limit_MB"] == 256 and sent["stdin"] == "1 2\n"
    assert "print(abs(a) + abs(b))" in sent["code"]
    # verl's keyword names reach it through the data sources' scorer
    assert default_compute_score("taco", ADD, STDIO_CASES, sandbox_fusion_url=url)["score"] == 1.0


def test_sandbox_errors_score_zero_and_are_counted(sandbox):
    url, handler = sandbox
    handler.fail = True
    got = compute_score(ADD, STDIO_CASES, sandbox_url=url)
    assert (got["score"], got["sandbox_errors"]) == (0.0, 4)
    unreachable = compute_score(ADD, STDIO_CASES, sandbox_url="http://127.0.0.1:9/run_code", timeout=1)
    assert (unreachable["score"], unreachable["sandbox_errors"]) == (0.0, 4)


def test_at_most_max_concurrent_requests_reach_the_server(sandbox):
    url, handler = sandbox
    threads = [threading.Thread(target=compute_score, args=(ADD, STDIO_CASES),
                                kwargs={"sandbox_url": url, "max_concurrent": 2}) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(handler.requests) == 24
    assert handler.most_in_flight == 2  # 6 scorers at once, held to 2 requests in flight
