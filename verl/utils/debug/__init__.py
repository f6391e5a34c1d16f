"""verl's older home of the profiling and memory helpers: the same names as :mod:`verl.utils.profiler`."""

from verl.utils.profiler import *  # noqa: F401,F403
from verl.utils.profiler import __all__  # noqa: F401
