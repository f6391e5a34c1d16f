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
