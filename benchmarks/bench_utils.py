"""Small helpers shared by the benchmark scripts: the host's precision and median-with-range summaries."""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def host_dtype(choice: str) -> str:
    """``--dtype auto`` -> ``bf16`` on a CPU with native bf16 (AVX-512 BF16 / AMX), ``fp32`` otherwise."""
    if choice != "auto":
        return choice
    sys.path.insert(0, str(REPO))
    from verl.utils.device import cpu_has_native_bf16  # the repo is put on the path just above

    return "bf16" if cpu_has_native_bf16() else "fp32"


def median_range(values) -> tuple[float, float, float]:
    """(median, min, max) of a benchmark's repeated measurements."""
    values = list(values)
    return statistics.median(values), min(values), max(values)


class StepEndWatcher:
    """Wall-clock time at which each step's first record lands in a metrics file (``trainer.logger=file``,
    flushed when the step's metrics are logged). The intervals between them are the training loop's period --
    data loading, the step itself and logging -- the same span a Hugging Face ``Trainer`` callback measures
    between two ``on_step_end`` calls."""

    def __init__(self, path, poll_s: float = 0.005):
        import threading

        self.path, self.poll_s = Path(path), poll_s
        self.times: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def _run(self):
        import time

        import json

        steps: set = set()
        while True:
            stopping = self._stop.is_set()
            try:
                lines = self.path.read_text().splitlines(keepends=True)
            except FileNotFoundError:
                lines = []
            now = time.perf_counter()
            for line in lines:
                if not line.endswith("\n"):
                    continue  # still being written
                step = json.loads(line).get("step")
                if step not in steps:  # a step's first record marks its end
                    steps.add(step)
                    self.times.append(now)
            if stopping:
                return
            time.sleep(self.poll_s)

    def intervals(self) -> list[float]:
        """Seconds between consecutive step ends (the first step has no start here and is left out)."""
        return [b - a for a, b in zip(self.times, self.times[1:])]
