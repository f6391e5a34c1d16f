"""How a call on a worker group becomes calls on its workers, and how their answers become one value.

A worker method decorated with ``@register(dispatch_mode=..., execute_mode=...)`` is bound onto the
worker group. Calling it on the group runs three steps:

1. ``dispatch_fn(worker_group, *args, **kwargs)`` turns the driver's arguments into one argument set
   per worker (each positional/keyword argument becomes a list with ``world_size`` entries);
2. the execute function (``execute_all`` or ``execute_rank_zero``) sends them to the workers;
3. ``collect_fn(worker_group, outputs)`` turns the per-worker answers into what the caller gets.

``Dispatch`` names the built-in (dispatch_fn, collect_fn) pairs; ``register_dispatch_mode`` adds new
ones. This module knows nothing about Ray: it only moves Python values (DataProtos, TensorDicts, lists) around.
"""

from __future__ import annotations

import functools
import inspect
import sys
from typing import Any, Callable

from tensordict import TensorDict

from verl.protocol import DataProto, DataProtoConfig, DataProtoFuture, pad_dataproto_to_divisor
from verl.utils import tensordict_utils as tu

MAGIC_ATTR = "attrs_3141562937"  # name of the attribute holding a method's registration (verl's value)
_PADDING_SIZE_KEY = "_padding_size_key_x123d"  # dispatch -> group: rows added by auto padding


class DispatchError(ValueError):
    """Raised by a dispatch function; the worker group adds the method name and re-raises."""


# ----------------------------------------------------------------------------------------------
# Extensible enums (``Dispatch.register("MY_MODE")`` adds ``Dispatch.MY_MODE``)
# ----------------------------------------------------------------------------------------------
def _enum_member(cls, name):
    """Unpickling hook: find (or re-create) a member, so modes registered on the driver survive
    the trip into a worker process that never ran the registration."""
    return cls._registry.get(name) or cls.register(name)


class _DynamicEnumMeta(type):
    def __iter__(cls):
        return iter(list(cls._registry.values()))

    def __contains__(cls, item):
        return isinstance(item, cls) and item.name in cls._registry

    def __getitem__(cls, name):
        return cls._registry[name]

    def __getattr__(cls, name):
        registry = cls.__dict__.get("_registry")
        if registry is not None and name in registry:
            return registry[name]
        raise AttributeError(f"{cls.__name__} has no member {name!r}")


class DynamicEnum(metaclass=_DynamicEnumMeta):
    """A small enum whose members can be added at run time (Python's Enum cannot)."""

    _registry: dict[str, "DynamicEnum"] = {}

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls._registry = {}

    def __init__(self, name: str, value: int):
        self.name = name
        self.value = value

    def __repr__(self):
        return f"<{type(self).__name__}.{self.name}: {self.value}>"

    def __reduce__(self):
        return (_enum_member, (type(self), self.name))

    @classmethod
    def register(cls, name: str) -> "DynamicEnum":
        if name in cls._registry:
            raise ValueError(f"{cls.__name__}.{name} is already registered")
        member = cls(name, len(cls._registry))
        cls._registry[name] = member
        return member

    @classmethod
    def remove(cls, name: str) -> "DynamicEnum":
        return cls._registry.pop(name)

    @classmethod
    def from_name(cls, name: str) -> "DynamicEnum | None":
        return cls._registry.get(name)


class Dispatch(DynamicEnum):
    """How arguments are spread over the workers and results gathered (see module docstring)."""


class Execute(DynamicEnum):
    """Which workers run the call: all of them, or rank 0 only."""


for _name in (
    "RANK_ZERO",
    "ONE_TO_ALL",
    "ALL_TO_ALL",
    "DP_COMPUTE",
    "DP_COMPUTE_PROTO",
    "DP_COMPUTE_PROTO_WITH_FUNC",
    "DP_COMPUTE_METRIC",
    "DIRECT_ROLLOUT_METHOD",
):
    Dispatch.register(_name)
Execute.register("ALL")
Execute.register("RANK_ZERO")


# ----------------------------------------------------------------------------------------------
# Dispatch / collect functions
# ----------------------------------------------------------------------------------------------
def dispatch_one_to_all(worker_group, *args, **kwargs):
    """Every worker receives the same arguments."""
    n = worker_group.world_size
    return tuple([a] * n for a in args), {k: [v] * n for k, v in kwargs.items()}


def dispatch_all_to_all(worker_group, *args, **kwargs):
    """Arguments go through untouched (lists of length world_size are split by the executor)."""
    return args, kwargs


def collect_all_to_all(worker_group, output):
    return output


def dispatch_rank_zero(worker_group, *args, **kwargs):
    return args, kwargs


def collect_rank_zero(worker_group, output):
    """Rank-zero execution yields one output; a list (from Execute.ALL) is reduced to rank 0's."""
    if isinstance(output, list):
        return output[0]
    return output


def dispatch_dp_compute(worker_group, *args, **kwargs):
    """Each argument must already be a list/tuple with one entry per worker."""
    n = worker_group.world_size
    for i, a in enumerate(args):
        if not isinstance(a, (list, tuple)) or len(a) != n:
            raise DispatchError(
                f"DP_COMPUTE expects every argument to be a list of length world_size={n}; "
                f"positional argument {i} is {type(a).__name__}"
                + (f" of length {len(a)}" if isinstance(a, (list, tuple)) else "")
            )
    for k, v in kwargs.items():
        if not isinstance(v, (list, tuple)) or len(v) != n:
            raise DispatchError(
                f"DP_COMPUTE expects every argument to be a list of length world_size={n}; "
                f"keyword argument {k!r} is {type(v).__name__}"
            )
    return args, kwargs


def collect_dp_compute(worker_group, output):
    if len(output) != worker_group.world_size:
        raise DispatchError(f"expected {worker_group.world_size} outputs, got {len(output)}")
    return output


def _is_dataproto_like(obj) -> bool:
    return isinstance(obj, (DataProto, DataProtoFuture)) or _is_tensordict(obj)


def _is_tensordict(obj) -> bool:
    return isinstance(obj, TensorDict)


def _padding_enabled(data) -> bool:
    if _is_tensordict(data):
        return bool(DataProtoConfig.auto_padding)
    if not isinstance(data, DataProto):
        return False
    if hasattr(data, "is_padding_enabled"):
        return bool(data.is_padding_enabled())
    return bool(getattr(DataProtoConfig, "auto_padding", False))


def split_dataproto_args(chunks: int, *args, **kwargs):
    """Chunk every DataProto / DataProtoFuture / TensorDict argument into ``chunks`` equal parts.

    With auto padding on (``DataProtoConfig.auto_padding`` or the DataProto's own flag) a batch whose
    length is not divisible is padded first; the number of padding rows travels back to the group in
    ``kwargs[_PADDING_SIZE_KEY]`` so it can unpad the collected result.
    """
    batch_len: int | None = None
    pad_size: int | None = None

    def split(name, obj):
        nonlocal batch_len, pad_size
        if _is_object_ref(obj):  # a ref to a whole batch: fetch it here, the driver has to split it
            obj = _materialize(obj)
        if not _is_dataproto_like(obj):
            raise DispatchError(
                f"argument {name} must be a DataProto, DataProtoFuture or TensorDict for a DP_COMPUTE_PROTO-style "
                f"dispatch, got {type(obj).__name__}"
            )
        is_td = _is_tensordict(obj)
        if isinstance(obj, DataProto) or is_td:
            n = len(obj)
            if _padding_enabled(obj):
                if batch_len is None:
                    batch_len = n
                elif batch_len != n:
                    raise DispatchError(
                        f"auto padding needs all batch arguments to have the same length; "
                        f"got {batch_len} and {n} (argument {name})"
                    )
                obj, pad_size = tu.pad_to_divisor(obj, chunks) if is_td else pad_dataproto_to_divisor(obj, chunks)
            elif n % chunks != 0:
                raise DispatchError(
                    f"batch of length {n} (argument {name}) is not divisible by the data-parallel size "
                    f"{chunks}; make the batch size a multiple of {chunks}, or turn on "
                    f"DataProtoConfig.auto_padding / pad with verl.protocol.pad_dataproto_to_divisor"
                )
        return tu.chunk_tensordict(obj, chunks) if is_td else obj.chunk(chunks=chunks)

    split_args = tuple(split(f"#{i}", a) for i, a in enumerate(args))
    split_kwargs = {k: split(repr(k), v) for k, v in kwargs.items()}
    if pad_size:
        split_kwargs[_PADDING_SIZE_KEY] = pad_size
    return split_args, split_kwargs


def dispatch_dp_compute_data_proto(worker_group, *args, **kwargs):
    return split_dataproto_args(worker_group.world_size, *args, **kwargs)


def dispatch_dp_compute_data_proto_with_func(worker_group, *args, **kwargs):
    """First positional argument is a function sent to every worker; the rest are chunked."""
    if not args or not callable(args[0]):
        raise DispatchError("DP_COMPUTE_PROTO_WITH_FUNC expects a function as the first argument")
    func, rest = args[0], args[1:]
    split_args, split_kwargs = split_dataproto_args(worker_group.world_size, *rest, **kwargs)
    return ([func] * worker_group.world_size, *split_args), split_kwargs


def _concat_outputs(outputs: list):
    """Concatenate DataProto outputs (DataProto.concat) or TensorDict outputs (concat_tensordict, jagged tensors
    included), or wrap ObjectRefs into a DataProtoFuture."""
    if outputs and all(_is_object_ref(o) for o in outputs):
        return DataProtoFuture.concat(list(outputs))
    if outputs and all(_is_tensordict(o) for o in outputs):
        return tu.concat_tensordict(list(outputs))
    for i, o in enumerate(outputs):
        if not isinstance(o, DataProto):
            raise DispatchError(
                f"a DP_COMPUTE_PROTO method must return a DataProto (or a TensorDict) on every rank; output {i} is "
                f"{type(o).__name__}"
            )
    return DataProto.concat(list(outputs))


def collect_dp_compute_data_proto(worker_group, output):
    collect_dp_compute(worker_group, output)
    return _concat_outputs(output)


# ----------------------------------------------------------------------------------------------
# N-d meshes: dispatch by data-parallel rank, collect from one rank per dp group
# ----------------------------------------------------------------------------------------------
def _mesh_info(worker_group, mesh_name):
    if mesh_name not in worker_group._dispatch_info:
        dp_ranks = worker_group._query_dispatch_info(mesh_name)
        collect = worker_group._query_collect_info(mesh_name)
        worker_group._dispatch_info[mesh_name] = list(dp_ranks)
        worker_group._collect_info[mesh_name] = list(collect)
    return worker_group._dispatch_info[mesh_name], worker_group._collect_info[mesh_name]


def dispatch_nd_compute_dataproto(mesh_name, worker_group, *args, **kwargs):
    """Chunk by dp size; every worker gets the chunk of its dp rank (tp/pp peers get the same one)."""
    dp_ranks, _ = _mesh_info(worker_group, mesh_name)
    dp_size = max(dp_ranks) + 1
    split_args, split_kwargs = split_dataproto_args(dp_size, *args, **kwargs)
    pad = split_kwargs.pop(_PADDING_SIZE_KEY, None)
    out_args = tuple([a[r] for r in dp_ranks] for a in split_args)
    out_kwargs = {k: [v[r] for r in dp_ranks] for k, v in split_kwargs.items()}
    if pad:
        out_kwargs[_PADDING_SIZE_KEY] = pad
    return out_args, out_kwargs


def collect_nd_compute_dataproto(mesh_name, worker_group, output):
    """Keep the output of the collect rank of each dp group, in dp order, and concatenate."""
    dp_ranks, collect = _mesh_info(worker_group, mesh_name)
    picked = sorted((dp_ranks[i], o) for i, o in enumerate(output) if collect[i])
    dp_size = max(dp_ranks) + 1
    if [r for r, _ in picked] != list(range(dp_size)):
        raise DispatchError(
            f"mesh {mesh_name!r}: expected exactly one collect rank per dp rank 0..{dp_size - 1}, "
            f"got collect ranks for dp ranks {[r for r, _ in picked]}"
        )
    return _concat_outputs([o for _, o in picked])


def make_nd_compute_dataproto_dispatch_fn(mesh_name: str) -> dict:
    """A dispatch mode (pass it as ``register(dispatch_mode=...)``) following a declared dp mesh.

    Workers declare their place with ``self._register_dispatch_collect_info(mesh_name, dp_rank,
    is_collect)``; the group asks them once and caches the answer.
    """
    return {
        "dispatch_fn": functools.partial(dispatch_nd_compute_dataproto, mesh_name),
        "collect_fn": functools.partial(collect_nd_compute_dataproto, mesh_name),
    }


def dummy_direct_rollout_call(worker_group, *args, **kwargs):
    raise NotImplementedError("DIRECT_ROLLOUT_METHOD methods are called on worker handles, not on the group")


DISPATCH_MODE_FN_REGISTRY: dict = {
    Dispatch.RANK_ZERO: {"dispatch_fn": dispatch_rank_zero, "collect_fn": collect_rank_zero},
    Dispatch.ONE_TO_ALL: {"dispatch_fn": dispatch_one_to_all, "collect_fn": collect_all_to_all},
    Dispatch.ALL_TO_ALL: {"dispatch_fn": dispatch_all_to_all, "collect_fn": collect_all_to_all},
    Dispatch.DP_COMPUTE: {"dispatch_fn": dispatch_dp_compute, "collect_fn": collect_dp_compute},
    Dispatch.DP_COMPUTE_PROTO: {
        "dispatch_fn": dispatch_dp_compute_data_proto,
        "collect_fn": collect_dp_compute_data_proto,
    },
    Dispatch.DP_COMPUTE_PROTO_WITH_FUNC: {
        "dispatch_fn": dispatch_dp_compute_data_proto_with_func,
        "collect_fn": collect_dp_compute_data_proto,
    },
    Dispatch.DP_COMPUTE_METRIC: {"dispatch_fn": dispatch_dp_compute_data_proto, "collect_fn": collect_dp_compute},
    Dispatch.DIRECT_ROLLOUT_METHOD: {
        "dispatch_fn": dummy_direct_rollout_call,
        "collect_fn": dummy_direct_rollout_call,
    },
}


def get_predefined_dispatch_fn(dispatch_mode) -> dict:
    return DISPATCH_MODE_FN_REGISTRY[dispatch_mode]


def register_dispatch_mode(dispatch_mode_name: str, dispatch_fn: Callable, collect_fn: Callable):
    """Add ``Dispatch.<dispatch_mode_name>`` with its own dispatch and collect functions."""
    if dispatch_mode_name in Dispatch._registry:
        raise ValueError(
            f"dispatch mode {dispatch_mode_name!r} already exists; use update_dispatch_mode to replace it"
        )
    member = Dispatch.register(dispatch_mode_name)
    DISPATCH_MODE_FN_REGISTRY[member] = {"dispatch_fn": dispatch_fn, "collect_fn": collect_fn}
    return member


def update_dispatch_mode(dispatch_mode, dispatch_fn: Callable, collect_fn: Callable):
    """Replace the functions of an existing mode (a ``Dispatch`` member or its name)."""
    member = Dispatch.from_name(dispatch_mode) if isinstance(dispatch_mode, str) else dispatch_mode
    if member not in Dispatch:
        raise ValueError(f"unknown dispatch mode {dispatch_mode!r}; known: {[m.name for m in Dispatch]}")
    DISPATCH_MODE_FN_REGISTRY[member] = {"dispatch_fn": dispatch_fn, "collect_fn": collect_fn}


def get_predefined_execute_fn(execute_mode) -> dict:
    names = {Execute.ALL: "execute_all", Execute.RANK_ZERO: "execute_rank_zero"}
    return {"execute_fn_name": names[execute_mode]}


# ----------------------------------------------------------------------------------------------
# @register
# ----------------------------------------------------------------------------------------------
def _check_dispatch_mode(dispatch_mode):
    if isinstance(dispatch_mode, Dispatch):
        return
    if isinstance(dispatch_mode, dict) and {"dispatch_fn", "collect_fn"} <= set(dispatch_mode):
        return
    raise ValueError(
        f"dispatch_mode={dispatch_mode!r} is neither a Dispatch member ({[m.name for m in Dispatch]}) nor a "
        f"dict with 'dispatch_fn' and 'collect_fn'"
    )


def _is_object_ref(obj) -> bool:
    ray = sys.modules.get("ray")  # only set when Ray is in use; this module never imports it
    return ray is not None and isinstance(obj, ray.ObjectRef)


def _materialize(obj):
    if _is_object_ref(obj):
        return sys.modules["ray"].get(obj)
    if isinstance(obj, DataProtoFuture):
        return obj.get()
    return obj


def _materialize_futures(*args, **kwargs):
    """Resolve DataProtoFuture / ObjectRef arguments inside the worker before the method runs."""
    return tuple(_materialize(a) for a in args), {k: _materialize(v) for k, v in kwargs.items()}


def register(dispatch_mode=Dispatch.ALL_TO_ALL, execute_mode=Execute.ALL, blocking=True, materialize_futures=True):
    """Mark a worker method as callable on its worker group.

    Args:
        dispatch_mode: a ``Dispatch`` member, or ``{"dispatch_fn": f, "collect_fn": g}``.
        execute_mode: ``Execute.ALL`` or ``Execute.RANK_ZERO``.
        blocking: False makes the group call return at once with ObjectRefs (a ``DataProtoFuture`` for
            DataProto-collecting modes) that can be passed straight into the next call.
        materialize_futures: resolve DataProtoFuture / ObjectRef arguments in the worker before running.
    """
    _check_dispatch_mode(dispatch_mode)
    if execute_mode not in Execute:
        raise ValueError(f"execute_mode={execute_mode!r} must be Execute.ALL or Execute.RANK_ZERO")

    def decorator(func):
        if inspect.iscoroutinefunction(func):

            @functools.wraps(func)
            async def inner(*args, **kwargs):
                if materialize_futures:
                    args, kwargs = _materialize_futures(*args, **kwargs)
                return await func(*args, **kwargs)

        else:

            @functools.wraps(func)
            def inner(*args, **kwargs):
                if materialize_futures:
                    args, kwargs = _materialize_futures(*args, **kwargs)
                return func(*args, **kwargs)

        attrs = {"dispatch_mode": dispatch_mode, "execute_mode": execute_mode, "blocking": blocking}
        setattr(inner, MAGIC_ATTR, attrs)
        return inner

    return decorator


def get_register_attrs(method) -> dict[str, Any] | None:
    return getattr(method, MAGIC_ATTR, None)
