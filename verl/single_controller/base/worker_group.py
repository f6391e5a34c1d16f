"""Backend-neutral pieces of a worker group: resource pools, deferred class construction, and the
binding of ``@register`` methods onto the group.

A backend (``verl.single_controller.ray``) subclasses ``WorkerGroup`` and supplies ``execute_all_async``,
``execute_rank_zero_async`` and ``_wait_outputs``; the binding logic below turns each registered worker
method into ``dispatch -> execute -> (wait) -> collect -> unpad`` on the group.
"""

from __future__ import annotations

from typing import Any, Callable

from verl.protocol import DataProto, DataProtoFuture, unpad_dataproto
from verl.single_controller.base.decorator import (
    _PADDING_SIZE_KEY,
    MAGIC_ATTR,
    Dispatch,
    DispatchError,
    Execute,
    _is_tensordict,
    dispatch_all_to_all,
    dispatch_rank_zero,
    get_predefined_dispatch_fn,
    get_predefined_execute_fn,
)


_PASS_THROUGH = (dispatch_all_to_all, dispatch_rank_zero)


class ResourcePool:
    """How many worker processes run on each node: ``process_on_nodes=[2, 2]`` is 2 nodes x 2."""

    def __init__(self, process_on_nodes=None, max_colocate_count: int = 10, n_gpus_per_node: int = 8) -> None:
        if process_on_nodes is None:
            process_on_nodes = []
        process_on_nodes = list(process_on_nodes)
        for n in process_on_nodes:
            if not isinstance(n, int) or n < 1:
                raise ValueError(f"process_on_nodes={process_on_nodes}: every entry must be a positive int")
        if max_colocate_count < 1:
            raise ValueError(f"max_colocate_count={max_colocate_count} must be >= 1")
        self._store = process_on_nodes
        self.max_colocate_count = max_colocate_count
        self.n_gpus_per_node = n_gpus_per_node

    def add_node(self, process_count: int) -> None:
        self._store.append(process_count)

    @property
    def world_size(self) -> int:
        return sum(self._store)

    def __call__(self) -> Any:
        return self._store

    @property
    def store(self):
        return self._store

    def local_world_size_list(self) -> list[int]:
        return [n for n in self._store for _ in range(n)]

    def local_rank_list(self) -> list[int]:
        return [i for n in self._store for i in range(n)]


class ClassWithInitArgs:
    """A class plus the arguments to build it later (in another process, on another node)."""

    def __init__(self, cls, *args, **kwargs) -> None:
        self.cls = cls
        self.args = args
        self.kwargs = kwargs
        self.fused_worker_used = False

    def __call__(self) -> Any:
        return self.cls(*self.args, **self.kwargs)


def _unwrap_cls(cls):
    """The user class behind a ``ray.remote`` wrapper (without importing Ray)."""
    return getattr(cls, "__ray_actor_class__", cls)


def func_generator(worker_group, method_name, dispatch_fn, collect_fn, execute_fn, blocking):
    """Build the group-level method for one registered worker method."""

    def func(*args, **kwargs):
        args, kwargs = worker_group._prepare_args(args, kwargs)
        try:
            args, kwargs = dispatch_fn(worker_group, *args, **kwargs)
        except DispatchError as err:
            raise ValueError(f"{worker_group._describe()}.{method_name}(): {err}") from None
        padding_size = kwargs.pop(_PADDING_SIZE_KEY, 0) if isinstance(kwargs, dict) else 0
        output = execute_fn(method_name, *args, **kwargs)
        if blocking:
            output = worker_group._wait_outputs(output, method_name)
        try:
            output = collect_fn(worker_group, output)
        except DispatchError as err:
            raise ValueError(f"{worker_group._describe()}.{method_name}(): {err}") from None
        if padding_size:
            output = _unpad_output(output, padding_size)
        return output

    func.__name__ = method_name
    return func


def _unpad_output(output, padding_size: int):
    """Drop the rows auto padding added (DataProto, DataProtoFuture or a per-row list)."""
    if isinstance(output, DataProto) or _is_tensordict(output):
        return unpad_dataproto(output, pad_size=padding_size)  # row slicing: the same for a TensorDict
    if isinstance(output, DataProtoFuture):
        inner = output.dispatch_fn

        def unpad_after(data, inner=inner, pad=padding_size):
            if inner is not None:
                data = inner(data)
            return unpad_dataproto(data, pad_size=pad)

        return DataProtoFuture(collect_fn=output.collect_fn, futures=output.futures, dispatch_fn=unpad_after)
    if isinstance(output, list):
        return output[:-padding_size]
    return output


def _first_of_each(execute_fn):
    def run(method_name, *args, **kwargs):
        return execute_fn(method_name, *(a[0] for a in args), **{k: v[0] for k, v in kwargs.items()})

    return run


class WorkerGroup:
    """A set of workers driven as one object; subclassed by each backend."""

    fused_worker_execute_fn_name = "_fuw_execute"

    def __init__(self, resource_pool: ResourcePool | None, **kwargs) -> None:
        self._is_init_with_detached_workers = resource_pool is None
        self.fused_worker_used = False
        self.sub_cls_name = ""
        self._procecss_dispatch_config = resource_pool() if resource_pool is not None else None
        self._workers: list = []
        self._worker_names: list[str] = []
        self._dispatch_info: dict[str, list[int]] = {}
        self._collect_info: dict[str, list[bool]] = {}
        self._master_addr = None
        self._master_port = None
        self.method_names: list[str] = []

    # --- backend hooks -----------------------------------------------------------------------
    def _prepare_args(self, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        return args, kwargs

    def _wait_outputs(self, output, method_name: str):
        raise NotImplementedError

    def _describe(self) -> str:
        return type(self).__name__

    def execute_all_async(self, method_name: str, *args, **kwargs):
        raise NotImplementedError

    def execute_rank_zero_async(self, method_name: str, *args, **kwargs):
        raise NotImplementedError

    # --- common surface ----------------------------------------------------------------------
    @property
    def world_size(self) -> int:
        return len(self._workers)

    def _is_worker_alive(self, worker) -> bool:
        raise NotImplementedError

    def _bind_worker_method(self, user_defined_cls, func_generator: Callable = func_generator) -> list[str]:
        """Bind every ``@register`` method of ``user_defined_cls`` as a method of this group."""
        user_defined_cls = _unwrap_cls(user_defined_cls)
        method_names = []
        for name in dir(user_defined_cls):
            try:
                method = getattr(user_defined_cls, name)
            except Exception:  # properties that fail on the class object
                continue
            attrs = getattr(method, MAGIC_ATTR, None) if callable(method) else None
            if attrs is None:
                continue
            dispatch_mode = attrs["dispatch_mode"]
            execute_mode = attrs["execute_mode"]
            if isinstance(dispatch_mode, Dispatch):
                if dispatch_mode is Dispatch.DIRECT_ROLLOUT_METHOD:
                    continue  # called on the worker handles directly
                fns = get_predefined_dispatch_fn(dispatch_mode)
                if dispatch_mode is Dispatch.RANK_ZERO:
                    execute_mode = Execute.RANK_ZERO
            else:
                fns = dispatch_mode
            execute_fn = getattr(self, get_predefined_execute_fn(execute_mode)["execute_fn_name"] + "_async")
            if execute_mode is Execute.RANK_ZERO and fns["dispatch_fn"] not in _PASS_THROUGH:
                execute_fn = _first_of_each(execute_fn)  # per-rank argument lists: rank 0 takes entry 0
            func = func_generator(
                self,
                name,
                dispatch_fn=fns["dispatch_fn"],
                collect_fn=fns["collect_fn"],
                execute_fn=execute_fn,
                blocking=attrs["blocking"],
            )
            func.__doc__ = getattr(method, "__doc__", None)
            try:
                setattr(self, name, func)
            except Exception as err:
                raise ValueError(f"cannot bind registered method {name!r} onto the worker group: {err}") from err
            method_names.append(name)
        return method_names
