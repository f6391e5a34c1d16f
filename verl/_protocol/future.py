"""``DataProtoFuture``: the lazy result of a non-blocking worker-group call (re-exported by :mod:`verl.protocol`).

The protocol layer does not import Ray or the single controller (the dependency points the other way:
single_controller -> protocol). A future only ever holds Ray object references when a Ray backend made it, so
Ray is already loaded by then; it is looked up in ``sys.modules`` at ``.get()`` time.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from tensordict import TensorDict

from verl.utils import tensordict_utils as tu

if TYPE_CHECKING:
    from verl.protocol import DataProto

# DataProto is imported inside the methods that use it: verl.protocol imports this module.


class WorkerError(RuntimeError):
    """A worker raised or died while computing its part of a group call; ``rank`` and ``cause`` (the backend's
    own error) are kept. Re-exported by ``verl.single_controller.ray``."""

    def __init__(self, message: str, rank: int, cause: BaseException):
        super().__init__(message)
        self.rank = rank
        self.cause = cause


def _ray():
    """The loaded Ray module (a future holding object refs implies the Ray backend imported it)."""
    ray = sys.modules.get("ray")
    if ray is None:
        raise RuntimeError("DataProtoFuture.get(): Ray is not loaded in this process; futures come from a "
                           "RayWorkerGroup call with blocking=False")
    return ray


def _died(err: BaseException) -> bool:
    """True when the backend says the worker process is gone (Ray's ActorDiedError and its subclasses)."""
    return any(cls.__name__ == "ActorDiedError" for cls in type(err).__mro__)


@dataclass
class DataProtoFuture:
    """The not-yet-fetched result of a non-blocking worker-group call.

    ``futures`` are Ray object refs (one per worker); ``.get()`` fetches them, joins them with ``collect_fn``
    and, if this future is one slice of a larger one, picks that slice with ``dispatch_fn``. Passing a future
    to the next worker group lets the data go worker -> worker without the driver waiting in between.
    """

    collect_fn: Callable
    futures: list
    dispatch_fn: Callable | None = None

    @staticmethod
    def concat(data: list) -> "DataProtoFuture":
        """A future that concatenates the DataProtos (or TensorDicts) behind ``data`` (Ray object refs)."""
        return DataProtoFuture(collect_fn=_concat_results, futures=list(data))

    def chunk(self, chunks: int) -> list["DataProtoFuture"]:
        """``chunks`` futures, the i-th resolving to chunk i of this future's value."""
        return [DataProtoFuture(collect_fn=self.collect_fn, futures=self.futures,
                                dispatch_fn=_ChunkSelector(i, chunks, self.dispatch_fn)) for i in range(chunks)]

    def get(self):
        """Fetch, collect and (for a chunk) select. A worker that raised or died surfaces as a
        ``WorkerError`` naming its rank, with the Ray error as ``cause``; with several failures, the
        lowest rank among those already finished (healthy ranks still running are not waited for: they
        may be blocked in a collective with the dead one)."""
        ray = _ray()
        try:
            outputs = ray.get(self.futures)
        except ray.exceptions.RayError as err:
            raise self._worker_error(err) from err
        for i, out in enumerate(outputs):
            if not (isinstance(out, TensorDict) or callable(getattr(type(out), "concat", None))):
                raise TypeError(f"DataProtoFuture: worker {i} returned {type(out).__name__}, expected DataProto "
                                f"or TensorDict")
        result = self.collect_fn(outputs)
        return self.dispatch_fn(result) if self.dispatch_fn is not None else result

    def _worker_error(self, err: BaseException) -> BaseException:
        """The failure of the first rank, in rank order, among the results already available."""
        ray = _ray()
        ready, _ = ray.wait(self.futures, num_returns=len(self.futures), timeout=0)
        ready = set(ready)
        for rank, ref in enumerate(self.futures):
            if ref not in ready:
                continue
            try:
                ray.get(ref)
            except ray.exceptions.RayError as cause:
                what = "died" if _died(cause) else "raised"
                msg = (f"DataProtoFuture: rank {rank} of {len(self.futures)} {what} while computing its result. "
                       f"Worker traceback / Ray error:\n{type(cause).__name__}: {cause}")
                return WorkerError(msg, rank=rank, cause=cause)
        return err


def _concat_results(parts: list):
    """DataProto.concat for DataProtos (the parts' own class), concat_tensordict for TensorDicts."""
    if parts and all(isinstance(p, TensorDict) for p in parts):
        return tu.concat_tensordict(parts)
    return type(parts[0]).concat(parts)


@dataclass
class _ChunkSelector:
    """Picklable ``dispatch_fn``: apply the parent's dispatch (if any), then take chunk ``index``."""

    index: int
    chunks: int
    parent: Callable | None = None

    def __call__(self, data: DataProto) -> DataProto:
        if self.parent is not None:
            data = self.parent(data)
        if isinstance(data, TensorDict):
            return tu.chunk_tensordict(data, self.chunks)[self.index]
        return data.chunk(chunks=self.chunks)[self.index]