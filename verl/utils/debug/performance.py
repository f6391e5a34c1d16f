"""verl's older path of the step timers: ``simple_timer`` and ``reduce_timing`` (see :mod:`verl.utils.profiler`)."""

from verl.utils.profiler.performance import reduce_timing, simple_timer

__all__ = ["reduce_timing", "simple_timer"]
