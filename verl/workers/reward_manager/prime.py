"""``prime``: score samples in parallel worker processes, with a per-sample timeout.

Rule-based scorers can be slow or can hang (sympy on adversarial LaTeX, executing generated code). Each
sample runs in one of ``num_processes`` persistent worker processes; a sample that raises scores 0 and counts
as an error, one that runs past ``timeout`` seconds scores 0 and counts as a timeout, and its worker process
(with everything it started: it leads its own process group) is killed and replaced. The trainer never
crashes on a bad scorer. Counts are reported per sample in ``reward_extra_info`` under
``reward/timeout_count`` and ``reward/error_count`` (1 for the samples concerned, so the list sums to the
batch total), as totals in ``reward_metrics`` of the ``return_dict`` output, and cumulatively in
``manager.timeout_count`` / ``manager.error_count``.

Workers are forked (``mp_start_method="fork"``, the default on Linux) so that any scorer works, including
a custom function loaded from a file; with ``"spawn"``/``"forkserver"`` the scorer must be picklable.
They are reused across calls and stop with ``manager.close()``, garbage collection, or process exit.
"""

from __future__ import annotations

import ctypes
import multiprocessing as mp
import os
import signal
import sys
import threading
import time
from multiprocessing.connection import wait
from typing import Any, Callable

from verl.utils.reward_score import is_default_scorer, require_score_fn
from verl.workers.reward_manager.abstract import AbstractRewardManager, RewardSample
from verl.workers.reward_manager.registry import register

_OK, _ERROR, _TIMEOUT = "ok", "error", "timeout"
_MAX_PRINTED_FAILURES = 3  # per call; the rest are summarised in one line


def _die_with_parent() -> None:
    """Linux: ask the kernel to SIGKILL this worker if the driver dies (no orphaned, hung scorers). Only set
    when forked from the main thread: the signal follows the *thread* that forked, and a pool created from
    a short-lived thread would otherwise lose its workers when that thread ends."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except Exception:
            pass


def _worker_main(conn, inherited, compute_score: Callable, kwargs: dict, die_with_parent: bool) -> None:
    try:
        os.setpgid(0, 0)  # own process group: a timeout kills the scorer's children too
    except OSError:
        pass
    if die_with_parent:
        _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the driver's business
    for c in inherited:  # driver-side pipe ends copied by fork: close them so EOF means "driver gone"
        try:
            c.close()
        except OSError:
            pass
    while True:
        try:
            task = conn.recv()
        except (EOFError, OSError):
            return
        if task is None:
            return
        idx, score_kwargs = task
        try:
            result = compute_score(**score_kwargs, **kwargs)
            msg = (idx, _OK, result)
        except BaseException as e:  # noqa: BLE001 - any scorer failure is a 0 score, not a dead worker
            msg = (idx, _ERROR, f"{type(e).__name__}: {e}")
        try:
            conn.send(msg)
        except Exception as e:  # result not picklable
            conn.send((idx, _ERROR, f"could not send the result back: {type(e).__name__}: {e}"))


class _Worker:
    def __init__(self, ctx, compute_score, kwargs, inherited):
        self.conn, child_conn = ctx.Pipe(duplex=True)
        forked = ctx.get_start_method() == "fork"
        inherited = [self.conn, *inherited] if forked else []
        die_with_parent = threading.current_thread() is threading.main_thread()
        self.proc = ctx.Process(target=_worker_main, daemon=True,
                                args=(child_conn, inherited, compute_score, kwargs, die_with_parent))
        self.proc.start()
        child_conn.close()
        self.task: int | None = None
        self.deadline = float("inf")

    def submit(self, idx: int, score_kwargs: dict, timeout: float) -> None:
        self.task, self.deadline = idx, time.monotonic() + timeout
        self.conn.send((idx, score_kwargs))

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError, OSError):
            pass
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(timeout=5)
        self.conn.close()

    def stop(self) -> None:
        try:
            self.conn.send(None)
        except (BrokenPipeError, OSError):
            pass
        self.proc.join(timeout=1)
        if self.proc.is_alive():
            self.kill()
        else:
            self.conn.close()


class ScoringPool:
    """Up to ``num_processes`` persistent worker processes running ``compute_score(**task, **kwargs)``.

    Workers are started on demand and reused across :meth:`run` calls (forking a large trainer process
    costs tens of milliseconds per worker); a worker that times out or dies is killed and replaced.
    """

    def __init__(self, compute_score: Callable, num_processes: int, kwargs: dict | None = None,
                 mp_start_method: str | None = None) -> None:
        self.compute_score = compute_score
        self.kwargs = dict(kwargs or {})
        self.num_processes = max(1, int(num_processes))
        self.ctx = mp.get_context(mp_start_method)
        self.workers: list[_Worker] = []

    def _spawn(self) -> _Worker:
        return _Worker(self.ctx, self.compute_score, self.kwargs, [w.conn for w in self.workers])

    def _replace(self, i: int) -> None:
        self.workers[i].kill()
        self.workers[i] = self._spawn()

    def run(self, tasks: list[dict], timeout: float) -> list[tuple[str, Any]]:
        """``(status, value)`` per task: ``ok`` (value = result), ``error`` (value = message) or ``timeout``."""
        if not tasks:
            return []
        while len(self.workers) < min(self.num_processes, len(tasks)):
            self.workers.append(self._spawn())
        for i, w in enumerate(self.workers):  # e.g. killed from outside between calls
            if not w.proc.is_alive():
                self._replace(i)
        results: list[tuple[str, Any] | None] = [None] * len(tasks)
        pending = list(range(len(tasks)))[::-1]  # pop() from the end -> submission in order
        try:
            while pending or any(w.task is not None for w in self.workers):
                for i, w in enumerate(self.workers):
                    if w.task is None and pending:
                        idx = pending.pop()
                        try:
                            w.submit(idx, tasks[idx], timeout)
                        except (BrokenPipeError, OSError):  # died while idle: retry on a fresh worker
                            pending.append(idx)
                            self._replace(i)
                busy = [w for w in self.workers if w.task is not None]
                if not busy:
                    continue
                wait_s = max(0.0, min(w.deadline for w in busy) - time.monotonic())
                ready = wait([w.conn for w in busy], timeout=wait_s)
                for i, w in enumerate(self.workers):
                    if w.task is None:
                        continue
                    if w.conn in ready:
                        try:
                            idx, status, value = w.conn.recv()
                        except (EOFError, OSError):  # the worker died (segfault, os._exit, OOM kill)
                            results[w.task] = (_ERROR, f"worker process exited with code {w.proc.exitcode}")
                            self._replace(i)
                            continue
                        results[idx] = (status, value)
                        w.task = None
                    elif time.monotonic() >= w.deadline:
                        results[w.task] = (_TIMEOUT, None)
                        self._replace(i)
        except BaseException:
            self.close()  # interrupted mid-batch: workers hold half-done tasks
            raise
        return results  # type: ignore[return-value]

    def close(self) -> None:
        workers, self.workers = self.workers, []
        for w in workers:
            if w.task is not None:
                w.kill()
            else:
                w.stop()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


def run_with_timeouts(compute_score: Callable, tasks: list[dict], num_processes: int, timeout: float,
                      kwargs: dict | None = None, mp_start_method: str | None = None) -> list[tuple[str, Any]]:
    """One-shot :class:`ScoringPool` run; all workers are gone when this returns."""
    pool = ScoringPool(compute_score, num_processes, kwargs, mp_start_method)
    try:
        return pool.run(tasks, timeout)
    finally:
        pool.close()


@register("prime")
class PrimeRewardManager(AbstractRewardManager):
    """Parallel scoring with per-sample timeouts (PRIME's reward manager).

    Extra constructor kwargs: ``num_processes`` (default: CPU count, at most 64), ``timeout`` seconds per
    sample (default 300), ``mp_start_method`` (default fork on Linux); anything else is forwarded to
    ``compute_score``.
    """

    def __init__(self, tokenizer, num_examine=0, compute_score=None, reward_fn_key="data_source",
                 num_processes: int | None = None, timeout: float = 300.0, mp_start_method: str | None = None,
                 **reward_kwargs) -> None:
        super().__init__(tokenizer, num_examine, compute_score, reward_fn_key, **reward_kwargs)
        self.num_processes = int(num_processes or min(os.cpu_count() or 1, 64))
        self.timeout = float(timeout)
        if self.timeout <= 0:
            raise ValueError(f"prime reward manager: timeout must be > 0 seconds, got {timeout}")
        if mp_start_method is None:
            mp_start_method = "fork" if "fork" in mp.get_all_start_methods() else None
        self.mp_start_method = mp_start_method
        self.timeout_count = 0
        self.error_count = 0
        self._last_counts = (0, 0)
        self._pool: ScoringPool | None = None

    def close(self) -> None:
        """Stop the worker processes (they also stop when the manager is garbage-collected or the process exits)."""
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    def __getstate__(self):  # worker processes do not travel (e.g. to a Ray task); they restart lazily
        state = dict(self.__dict__)
        state["_pool"] = None
        return state

    def _check_data_sources(self, samples: list[RewardSample]) -> None:
        """With the built-in scorer, an unknown data_source would raise in every worker and score 0 as an
        "error": the run would train on all-zero reward. Fail here, on the driver, with the registry's
        message (which says how to plug in a custom function)."""
        if not is_default_scorer(self.compute_score):
            return
        for data_source in dict.fromkeys(s.data_source for s in samples):
            require_score_fn(data_source)  # raises UnknownDataSourceError

    def score_samples(self, samples: list[RewardSample]) -> list:
        self._check_data_sources(samples)
        if self._pool is None:
            self._pool = ScoringPool(self.compute_score, self.num_processes, self.reward_kwargs, self.mp_start_method)
        outcomes = self._pool.run([s.score_kwargs() for s in samples], self.timeout)
        results, timeouts, errors = [], [], []
        failures = 0
        for sample, (status, value) in zip(samples, outcomes):
            if status == _OK:
                results.append(value)
            else:
                results.append(0.0)
                failures += 1
                if failures <= _MAX_PRINTED_FAILURES:
                    detail = f"after {self.timeout:g}s" if status == _TIMEOUT else value
                    print(f"[prime reward] sample {sample.index} ({sample.data_source}): scorer {status} "
                          f"{detail}; score set to 0")
            timeouts.append(int(status == _TIMEOUT))
            errors.append(int(status == _ERROR))
        if failures > _MAX_PRINTED_FAILURES:
            print(f"[prime reward] ... and {failures - _MAX_PRINTED_FAILURES} more failed samples in this batch "
                  f"({sum(timeouts)} timeouts, {sum(errors)} errors in total); all scored 0")
        self._flags = (timeouts, errors)
        self._last_counts = (sum(timeouts), sum(errors))
        self.timeout_count += self._last_counts[0]
        self.error_count += self._last_counts[1]
        return results

    def postprocess(self, samples, scores, extra):
        timeouts, errors = self._flags
        extra["reward/timeout_count"] = timeouts
        extra["reward/error_count"] = errors
        return scores, extra

    def batch_metrics(self) -> dict[str, float]:
        return {"reward/timeout_count": self._last_counts[0], "reward/error_count": self._last_counts[1]}
