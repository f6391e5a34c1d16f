"""Step timing: ``with marked_timer("gen", timing_raw): ...`` adds the elapsed seconds to ``timing_raw["gen"]``."""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Iterator

__all__ = ["marked_timer", "_timer", "simple_timer"]


@contextmanager
def simple_timer(name: str, timing_raw: dict) -> Iterator[None]:
    start = time.perf_counter()
    try:
        yield
    finally:
        timing_raw[name] = timing_raw.get(name, 0.0) + time.perf_counter() - start


@contextmanager
def marked_timer(name: str, timing_raw: dict, color: str | None = None, **kwargs) -> Iterator[None]:
    """verl's profiler-aware timer; ``color`` and other kwargs (profiler marks) are accepted and ignored."""
    with simple_timer(name, timing_raw):
        yield


_timer = simple_timer
