"""Per-step profiling of worker calls (verl's ``DistProfiler`` / ``DistProfilerExtension``) and named ranges.

How a run is profiled (``global_profiler.tool``, ``global_profiler.steps``, per-role ``profiler.*`` keys):

1. every worker builds a ``DistProfiler`` from its role's ``profiler`` section and exposes it to the trainer
   through ``DistProfilerExtension`` (group methods ``start_profile`` / ``stop_profile``);
2. the trainer calls ``start_profile(profile_step=N)`` before each step listed in ``global_profiler.steps`` and
   ``stop_profile()`` after it;
3. worker methods decorated with ``@DistProfiler.annotate(role="actor_update")`` are recorded while a step is
   profiled. ``tool=torch``: each call runs under ``torch.profiler`` and its Chrome trace (gzip JSON, opens in
   Perfetto, chrome://tracing and TensorBoard's profiler) goes to
   ``<save_path>/<step>/<role>/prof_rank-<rank>.pt.trace.json.gz`` (a second call of the same role in the same
   step: ``prof_rank-<rank>-call2...``). ``tool=torch_memory`` (CUDA): the allocator history of the step, written
   as ``<save_path>/<step>/torch_memory/prof_rank-<rank>.pickle`` (open it at pytorch.org/memory_viz).

A role is profiled when its ``profiler.enable`` is true (``torch_memory`` follows the trainer's start/stop alone,
as in verl), on the ranks ``all_ranks`` / ``ranks`` select (default: rank 0). Torch runs one profiler recording
per process at a time, so with several roles in one process a call that starts while another role's call is being
traced (a nested call) is recorded inside that trace as a named range.
"""

from __future__ import annotations

import functools
import os
from collections import Counter
from contextlib import contextmanager, nullcontext
from typing import Any, Callable, Iterator, Optional

import torch
import torch.distributed as dist

from verl.single_controller.base.decorator import Dispatch, register
from verl.utils.device import get_device_name, torch_profiler_activities
from verl.utils.profiler.config import ProfilerConfig, TorchProfilerToolConfig, tool_settings

__all__ = ["DistProfiler", "DistProfilerExtension", "Profiler", "mark_start_range", "mark_end_range",
           "mark_annotate", "DEFAULT_SAVE_PATH"]

DEFAULT_SAVE_PATH = "outputs/profile"
NOT_HERE = {"nsys": "Nsight Systems profiling", "npu": "Ascend NPU profiling"}


# ------------------------------------------------------------------------------------------------ ranges

def mark_start_range(message: Optional[str] = None, color: Optional[str] = None, domain: Optional[str] = None,
                     category: Optional[str] = None) -> Any:
    """Open a named range in the torch trace being recorded (if any); returns the handle for
    :func:`mark_end_range`. ``color``, ``domain`` and ``category`` style Nsight / Ascend markers only."""
    handle = torch.profiler.record_function(message or "range")
    handle.__enter__()
    return handle


def mark_end_range(range_id: Any) -> None:
    """Close a range opened by :func:`mark_start_range`."""
    range_id.__exit__(None, None, None)


def mark_annotate(message: Optional[str] = None, color: Optional[str] = None, domain: Optional[str] = None,
                  category: Optional[str] = None) -> Callable:
    """Decorator: every call of the function is a named range (``message``, default the function's name)."""

    def decorator(func):
        name = message or func.__name__

        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            with torch.profiler.record_function(name):
                return func(*args, **kwargs)

        return wrapper

    return decorator


# ----------------------------------------------------------------------------------------- torch traces

class _TorchTrace:
    """One torch.profiler recording, written as a Chrome trace to ``path`` when it stops."""

    running = False  # torch runs one recording per process at a time

    def __init__(self, path: str):
        self.path = path
        self.prof = None

    def start(self) -> bool:
        """Start recording; False (and nothing recorded) while another recording of this process runs."""
        if _TorchTrace.running:
            return False
        self.prof = torch.profiler.profile(activities=torch_profiler_activities())
        self.prof.start()
        _TorchTrace.running = True
        return True

    def stop(self) -> Optional[str]:
        """Stop and write the trace; its path (None if this recording never started)."""
        if self.prof is None:
            return None
        prof, self.prof = self.prof, None
        prof.stop()
        _TorchTrace.running = False
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        prof.export_chrome_trace(self.path)
        return self.path


def trace_file(save_path: Optional[str], step: Any, role: str, rank: int, call: int = 1) -> str:
    """``<save_path>/<step>/<role>/prof_rank-<rank>[-call<k>].pt.trace.json.gz``."""
    name = f"prof_rank-{rank}" + (f"-call{call}" if call > 1 else "") + ".pt.trace.json.gz"
    return os.path.join(save_path or DEFAULT_SAVE_PATH, str(step), role, name)


class _CudaMemoryHistory:
    """The CUDA caching allocator's history from start to stop, dumped as a snapshot (one per process)."""

    owner = None

    def __init__(self, max_entries: int):
        self.max_entries = int(max_entries)

    def start(self) -> bool:
        if _CudaMemoryHistory.owner is not None:
            return False
        torch.cuda.memory._record_memory_history(max_entries=self.max_entries)
        _CudaMemoryHistory.owner = self
        return True

    def stop(self, path: str) -> Optional[str]:
        if _CudaMemoryHistory.owner is not self:
            return None
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        torch.cuda.memory._dump_snapshot(path)
        torch.cuda.memory._record_memory_history(enabled=None)
        _CudaMemoryHistory.owner = None
        return path


# ------------------------------------------------------------------------------------------ DistProfiler

class DistProfiler:
    """A worker's profiler: armed by ``start(profile_step=N)``, disarmed by ``stop()``; records the calls of the
    methods decorated with :meth:`annotate` in between (see the module docstring)."""

    def __init__(self, rank: int, config: Any = None, tool_config: Any = None, **kwargs):
        self.rank = rank
        self.config = ProfilerConfig.from_config(config)
        if tool_config is not None:
            self.config.tool_config = tool_settings(self.config.tool, tool_config)
        self.tool = self.config.tool
        if self.tool in NOT_HERE and self.config.enable:
            raise ValueError(f"profiler tool={self.tool}: {NOT_HERE[self.tool]} is not available here; use "
                             "tool=torch (Chrome traces of every profiled worker call)")
        if self.tool == "torch_memory" and get_device_name() != "cuda":
            raise ValueError(f"profiler tool=torch_memory records the CUDA memory allocator and needs a CUDA GPU "
                             f"(this process runs on {get_device_name()}); use tool=torch")
        # torch_memory answers the trainer's start/stop whatever the role's enable says (as in verl)
        wanted = self.tool == "torch_memory" or (self.tool == "torch" and self.config.enable)
        self.enabled = bool(wanted and self.config.selects(rank))
        self.step = None  # the training step being profiled, between start() and stop()
        self._starts = 0
        self._calls: Counter = Counter()
        self._memory: Optional[_CudaMemoryHistory] = None

    @property
    def save_path(self) -> str:
        return self.config.save_path or DEFAULT_SAVE_PATH

    def start(self, **kwargs) -> None:
        """Arm for the step ``profile_step`` (``role`` and other keywords of verl's call are accepted)."""
        if not self.enabled:
            return
        self._starts += 1
        step = kwargs.get("profile_step")
        self.step = step if step is not None else f"start{self._starts}"
        self._calls.clear()
        if self.tool == "torch_memory":
            entries = getattr(self.config.tool_config, "trace_alloc_max_entries", 100_000)
            self._memory = _CudaMemoryHistory(entries)
            self._memory.start()

    def stop(self) -> None:
        """Disarm; with ``torch_memory``, write the step's memory snapshot."""
        if self._memory is not None:
            path = os.path.join(self.save_path, str(self.step), "torch_memory", f"prof_rank-{self.rank}.pickle")
            if self._memory.stop(path):
                print(f"[profiler] rank {self.rank}: CUDA memory snapshot of step {self.step} -> {path}", flush=True)
            self._memory = None
        self.step = None

    @contextmanager
    def trace(self, role: str) -> Iterator[None]:
        """Record the block as one call of ``role`` when a step is being profiled with ``tool=torch``."""
        if not (self.enabled and self.tool == "torch" and self.step is not None) or _TorchTrace.running:
            yield  # not profiled, or nested in a call being recorded (it is a named range there)
            return
        self._calls[role] += 1
        recording = _TorchTrace(trace_file(self.save_path, self.step, role, self.rank, self._calls[role]))
        recording.start()
        try:
            yield
        finally:
            path = recording.stop()
            print(f"[profiler] rank {self.rank}: trace of {role} (step {self.step}) -> {path}", flush=True)

    @classmethod
    def annotate(cls, message: Optional[str] = None, color: Optional[str] = None, domain: Optional[str] = None,
                 category: Optional[str] = None, **kwargs) -> Callable:
        """Decorator for a worker method: a named range always, and a trace of its own (folder ``role``, default
        the method's name) when its worker's ``self.profiler`` is profiling this step."""
        role = kwargs.get("role")

        def decorator(func):
            name = message or func.__name__

            @functools.wraps(func)
            def wrapper(self_instance, *args, **kw):
                profiler = getattr(self_instance, "profiler", None)
                recording = profiler.trace(role or name) if isinstance(profiler, DistProfiler) else nullcontext()
                with recording, torch.profiler.record_function(name):
                    return func(self_instance, *args, **kw)

            return wrapper

        return decorator


class DistProfilerExtension:
    """Mixin for workers: ``start_profile`` / ``stop_profile`` as group methods (every rank) driving
    ``self.profiler``."""

    def __init__(self, profiler: DistProfiler):
        self.profiler = profiler

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def start_profile(self, **kwargs) -> None:
        """Profile this rank's annotated calls from now on, as step ``profile_step``."""
        self.profiler.start(**kwargs)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def stop_profile(self) -> None:
        """Stop profiling (and write what the tool writes at the end of a step)."""
        self.profiler.stop()


# -------------------------------------------------------------------------------------------- Profiler

class Profiler:
    """verl's plain torch profiler: ``start()`` ... ``stop()`` records this rank (when ``config.enable`` and the
    rank is selected) and writes ``<save_path>/[<prefix>_]prof_rank-<rank>.pt.trace.json.gz``."""

    def __init__(self, config: Any = None, tool_config: Optional[TorchProfilerToolConfig] = None,
                 save_file_prefix: Optional[str] = None):
        self.config = ProfilerConfig.from_config(config)
        self.tool_config = tool_config
        self.rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
        self.enable = bool(self.config.enable) and self.config.selects(self.rank)
        name = f"prof_rank-{self.rank}.pt.trace.json.gz"
        if save_file_prefix:
            name = f"{save_file_prefix}_{name}"
        self._recording = _TorchTrace(os.path.join(self.config.save_path or DEFAULT_SAVE_PATH, name))
        self.saved: Optional[str] = None

    def check(self) -> bool:
        """Whether this rank is being recorded."""
        return self._recording.prof is not None

    def start(self) -> None:
        if self.enable and not self.check():
            self._recording.start()

    def step(self) -> None:
        """Mark an iteration boundary in the trace."""
        if self.check():
            self._recording.prof.step()

    def stop(self) -> None:
        """Stop recording and write the trace (path in ``saved``)."""
        if self.check():
            self.saved = self._recording.stop()

    save = stop_and_save = stop
