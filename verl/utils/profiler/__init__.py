"""Profiling and timing under verl's names (``from verl.utils.profiler import DistProfiler, marked_timer, ...``).

- ``DistProfiler`` / ``DistProfilerExtension``: per-step profiling of worker calls (``global_profiler.*`` and the
  roles' ``profiler.*`` keys; see :mod:`verl.utils.profiler.profile` and docs/profiling.md);
- ``ProfilerConfig``: one role's profiler settings; ``Profiler``: a plain start/stop torch profiler;
- ``mark_start_range`` / ``mark_end_range`` / ``mark_annotate``: named ranges in the torch trace being recorded;
- ``simple_timer`` / ``marked_timer``: accumulate a block's seconds into a timing dict;
- ``log_gpu_memory_usage`` / ``GPUMemoryLogger``: memory lines for debugging.
"""

from verl.utils.profiler.config import ProfilerConfig
from verl.utils.profiler.performance import GPUMemoryLogger, log_gpu_memory_usage, marked_timer, simple_timer
from verl.utils.profiler.profile import (DistProfiler, DistProfilerExtension, Profiler, mark_annotate, mark_end_range,
                                         mark_start_range)

__all__ = [
    "GPUMemoryLogger",
    "log_gpu_memory_usage",
    "mark_start_range",
    "mark_end_range",
    "mark_annotate",
    "DistProfiler",
    "DistProfilerExtension",
    "Profiler",
    "ProfilerConfig",
    "simple_timer",
    "marked_timer",
]
