"""Memory logging and step timing under verl's names.

- ``log_gpu_memory_usage(head)``: one line with the accelerator's allocated / reserved / used / total memory (on
  CPU: this process's resident memory and the host's used / total memory);
- ``@GPUMemoryLogger(role="actor")``: the same line before and after each call of the decorated function;
- ``simple_timer`` / ``marked_timer``: the timers of :mod:`verl.utils.timer`; ``reduce_timing``: a timing dict
  averaged (or summed, ...) over the ranks of the default process group.
"""

from __future__ import annotations

import functools
import logging
import os
from typing import Callable, Optional

import psutil
import torch
import torch.distributed as dist

from verl.utils.device import get_device_name, get_torch_device
from verl.utils.timer import _timer, marked_timer, simple_timer

__all__ = ["log_gpu_memory_usage", "GPUMemoryLogger", "simple_timer", "marked_timer", "_timer", "reduce_timing"]

_GB = 1024**3


def _memory_line(head: str) -> str:
    if get_device_name() == "cpu":
        rss = psutil.Process(os.getpid()).memory_info().rss / _GB
        host = psutil.virtual_memory()
        return (f"{head}, process memory (GB): {rss:.2f}, host memory used/total (GB): "
                f"{host.used / _GB:.2f}/{host.total / _GB:.2f}")
    device = get_torch_device()
    free, total = device.mem_get_info()
    return (f"{head}, memory allocated (GB): {device.memory_allocated() / _GB:.2f}, memory reserved (GB): "
            f"{device.memory_reserved() / _GB:.2f}, device memory used/total (GB): "
            f"{(total - free) / _GB:.2f}/{total / _GB:.2f}")


def _this_rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def log_gpu_memory_usage(head: str, logger: Optional[logging.Logger] = None, level: int = logging.DEBUG,
                         rank: Optional[int] = 0) -> None:
    """Print (or log at ``level`` with ``logger``) the memory line on rank ``rank`` (None: every rank)."""
    if rank is not None and _this_rank() != rank:
        return
    message = _memory_line(head)
    if logger is None:
        print(message, flush=True)
    else:
        logger.log(level, message)


class GPUMemoryLogger:
    """Decorator: log the memory line before and after every call (``role`` names the caller in the line)."""

    def __init__(self, role: str, logger: Optional[logging.Logger] = None, level: int = logging.DEBUG,
                 log_only_rank_0: bool = True):
        self.role, self.logger, self.level = role, logger, level
        self.log_only_rank_0 = log_only_rank_0

    def __call__(self, func: Callable) -> Callable:
        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            rank = 0 if self.log_only_rank_0 else None
            log_gpu_memory_usage(f"[{self.role}] before {func.__name__}", self.logger, self.level, rank)
            out = func(*args, **kwargs)
            log_gpu_memory_usage(f"[{self.role}] after {func.__name__}", self.logger, self.level, rank)
            return out

        return wrapper


def reduce_timing(timing_raw: dict[str, float], reduce_op=dist.ReduceOp.AVG) -> dict[str, float]:
    """``timing_raw`` reduced over the ranks of the default group (unchanged without one). AVG is computed as a
    sum divided by the world size, so it works on gloo (CPU) too."""
    if not (dist.is_available() and dist.is_initialized()) or not timing_raw:
        return dict(timing_raw)
    names = sorted(timing_raw)
    device = "cpu" if dist.get_backend() == "gloo" else get_device_name()
    values = torch.tensor([float(timing_raw[n]) for n in names], dtype=torch.float64, device=device)
    average = reduce_op == dist.ReduceOp.AVG
    dist.all_reduce(values, op=dist.ReduceOp.SUM if average else reduce_op)
    if average:
        values /= dist.get_world_size()
    return dict(zip(names, values.tolist()))
