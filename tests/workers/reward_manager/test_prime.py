import os
import subprocess
import time

import psutil
import pytest
import torch

from verl.workers.reward_manager import NaiveRewardManager, PrimeRewardManager

ROWS = [
    ("Q1", "#### 8", "openai/gsm8k", "8"),
    ("Q2", "hang", "openai/gsm8k", "8"),
    ("Q3", "#### 9", "openai/gsm8k", "8"),
    ("Q4", "boom", "openai/gsm8k", "8"),
    ("Q5", "#### 8", "openai/gsm8k", "8"),
]


def misbehaving_scorer(data_source, solution_str, ground_truth, extra_info=None):
    if solution_str == "hang":
        time.sleep(60)
    if solution_str == "boom":
        raise RuntimeError("scorer exploded")
    if solution_str == "exit":
        os._exit(3)
    return {"score": float(solution_str == f"#### {ground_truth}"), "pid": os.getpid()}


def _live_children(ignore=()):
    """Running descendants of this process, minus the pids in ``ignore`` (e.g. a Ray cluster or other
    helpers started by earlier tests in the same session)."""
    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            if p.pid not in ignore and p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


def _baseline():
    return {p.pid for p in _live_children()}


def _wait_for_children(ignore, at_most=0, timeout=10.0):
    """Poll until at most ``at_most`` new children run (killed workers take a moment to be reaped)."""
    deadline = time.monotonic() + timeout
    while True:
        live = _live_children(ignore)
        if len(live) <= at_most or time.monotonic() >= deadline:
            return live
        time.sleep(0.05)


def test_prime_matches_naive_with_default_scorer(char_tokenizer, make_batch):
    rows = [r for r in ROWS if r[1].startswith("####")]
    data = make_batch(rows)
    mgr = PrimeRewardManager(char_tokenizer, 0, num_processes=2, timeout=30)
    prime = mgr(data)
    assert torch.equal(prime, NaiveRewardManager(char_tokenizer, 0)(data))
    assert prime.sum().item() == 2.0
    mgr.close()


def test_prime_reuses_workers_and_pickles_without_them(char_tokenizer, make_batch):
    import pickle

    data = make_batch([r for r in ROWS if r[1].startswith("####")])
    before = _baseline()
    mgr = PrimeRewardManager(char_tokenizer, 0, compute_score=misbehaving_scorer, num_processes=2, timeout=30)
    first = set(mgr(data, return_dict=True)["reward_extra_info"]["pid"])
    second = set(mgr(data, return_dict=True)["reward_extra_info"]["pid"])
    assert first == second and os.getpid() not in first and len(first) <= 2
    clone = pickle.loads(pickle.dumps(mgr))
    assert clone._pool is None and torch.equal(clone(data), mgr(data))
    clone.close()
    mgr.close()
    assert _wait_for_children(before) == []


def test_prime_survives_hanging_and_raising_scorers(char_tokenizer, make_batch, response_lengths):
    data = make_batch(ROWS)
    before = _baseline()
    # timeout=5 leaves a busy CI machine room to fork and score; the "hang" sample sleeps 60 s.
    mgr = PrimeRewardManager(char_tokenizer, 0, compute_score=misbehaving_scorer, num_processes=2, timeout=5)
    start = time.monotonic()
    out = mgr(data, return_dict=True)
    elapsed = time.monotonic() - start
    assert elapsed < 30, f"a hung scorer must be cut at the timeout, took {elapsed:.1f}s"

    lens = response_lengths(ROWS)
    scores = [out["reward_tensor"][i, n - 1].item() for i, n in enumerate(lens)]
    assert scores == [1.0, 0.0, 0.0, 0.0, 1.0]
    info = out["reward_extra_info"]
    assert info["reward/timeout_count"] == [0, 1, 0, 0, 0]
    assert info["reward/error_count"] == [0, 0, 0, 1, 0]
    assert info["score"] == [1.0, 0.0, 0.0, 0.0, 1.0]
    assert all(isinstance(p, int) and p != os.getpid() for i, p in enumerate(info["pid"]) if i in (0, 2, 4))
    assert out["reward_metrics"] == {"reward/timeout_count": 1, "reward/error_count": 1}
    assert len(_wait_for_children(before, at_most=2)) <= 2, \
        "the hung worker must be killed, not left running beside its replacement"

    mgr(data)  # counters accumulate across calls
    assert (mgr.timeout_count, mgr.error_count) == (2, 2)
    mgr.close()
    assert _wait_for_children(before) == []


def test_prime_kills_hung_worker_and_its_children(char_tokenizer, make_batch, tmp_path):
    pid_file = tmp_path / "grandchild.pid"

    def spawning_scorer(data_source, solution_str, ground_truth, extra_info=None):
        if solution_str == "hang":
            child = subprocess.Popen(["sleep", "60"])
            pid_file.write_text(str(child.pid))
            time.sleep(60)
        return 1.0

    data = make_batch([("Q", "hang", "x", "1"), ("Q", "ok", "x", "1")])
    mgr = PrimeRewardManager(char_tokenizer, 0, compute_score=spawning_scorer, num_processes=2, timeout=5)
    out = mgr(data, return_dict=True)
    mgr.close()
    assert out["reward_extra_info"]["reward/timeout_count"] == [1, 0]
    grandchild = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            if psutil.Process(grandchild).status() == psutil.STATUS_ZOMBIE:
                break
        except psutil.NoSuchProcess:
            break
        time.sleep(0.05)
    else:
        pytest.fail("the hung scorer's subprocess is still running")


def test_prime_replaces_a_crashed_worker(char_tokenizer, make_batch):
    rows = [("Q", "exit", "openai/gsm8k", "8")] + [("Q", "#### 8", "openai/gsm8k", "8")] * 3
    data = make_batch(rows)
    mgr = PrimeRewardManager(char_tokenizer, 0, compute_score=misbehaving_scorer, num_processes=1, timeout=10)
    out = mgr(data, return_dict=True)
    mgr.close()
    assert out["reward_extra_info"]["reward/error_count"] == [1, 0, 0, 0]
    assert out["reward_tensor"].sum().item() == 3.0


def test_prime_rejects_bad_timeout(char_tokenizer):
    with pytest.raises(ValueError, match="timeout"):
        PrimeRewardManager(char_tokenizer, 0, timeout=0)


def test_prime_rejects_unknown_data_source_on_the_driver(char_tokenizer, make_batch):
    from verl.utils.reward_score import UnknownDataSourceError

    data = make_batch([("Q", "#### 8", "openai/gsm8k", "8"), ("Q", "#### 8", "my_org/riddles", "8")])
    mgr = PrimeRewardManager(char_tokenizer, 0, num_processes=1, timeout=30)
    with pytest.raises(UnknownDataSourceError, match="'my_org/riddles'.*custom_reward_function.path"):
        mgr(data)
    assert mgr._pool is None, "the check runs before any worker is started"
    # a custom scorer may handle any data_source: no check
    custom = PrimeRewardManager(char_tokenizer, 0, compute_score=misbehaving_scorer, num_processes=1, timeout=30)
    assert custom(data).sum().item() == 2.0
    custom.close()


def test_prime_prints_only_the_first_failures(char_tokenizer, make_batch, capsys):
    data = make_batch([("Q", "boom", "openai/gsm8k", "8")] * 6)
    mgr = PrimeRewardManager(char_tokenizer, 0, compute_score=misbehaving_scorer, num_processes=1, timeout=30)
    out = mgr(data, return_dict=True)
    mgr.close()
    assert out["reward_metrics"]["reward/error_count"] == 6
    printed = capsys.readouterr().out.splitlines()
    assert sum("scorer exploded" in line for line in printed) == 3
    assert any("3 more failed samples" in line for line in printed)
