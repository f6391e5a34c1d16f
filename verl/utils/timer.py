"""Step timing: ``with marked_timer("gen", timing_raw): ...`` adds the elapsed seconds to ``timing_raw["gen"]``.

``marked_timer`` also marks the block as a named range (``torch.profiler.record_function``), so a block timed in a
worker shows up by name in a torch trace that is being recorded (``global_profiler.tool=torch``); outside a trace the
mark costs a few microseconds. ``verl.utils.profiler`` exports both timers under verl's names.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Iterator, Optional

import torch

__all__ = ["marked_timer", "_timer", "simple_timer"]


@contextmanager
def simple_timer(name: str, timing_raw: dict) -> Iterator[None]:
    """Add the seconds the block takes to ``timing_raw[name]`` (created at 0)."""
    start = time.perf_counter()
    try:
        yield
    finally:
        timing_raw[name] = timing_raw.get(name, 0.0) + time.perf_counter() - start


@contextmanager
def marked_timer(name: str, timing_raw: dict, color: Optional[str] = None, domain: Optional[str] = None,
                 category: Optional[str] = None) -> Iterator[None]:
    """:func:`simple_timer` plus a profiler range named ``name``; ``color``, ``domain`` and ``category`` are verl's
    marker styling (Nsight / Ascend timelines) and do not change a torch trace."""
    with torch.profiler.record_function(name), simple_timer(name, timing_raw):
        yield


_timer = simple_timer
