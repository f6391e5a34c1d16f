"""Several roles in one worker process: the basis of the hybrid engine.

``create_colocated_worker_cls({"actor": RayClassWithInitArgs(A, ...), "critic": ...})`` builds one
worker class (``WorkerDict``) whose instance holds one instance per role and exposes every registered
method of role ``r`` as ``{r}_{method}``. ``RayWorkerGroup.spawn(prefix_set)`` then gives one group per
role whose methods call the role's instance inside the shared processes.

The fused variant keeps the role methods off the outer class; calls go through one entry point
(``_fuw_execute(role, method, ...)``), and ``RayWorkerGroup.fuse(prefix_set)`` attaches the role groups
as attributes (``wg.actor.update_actor(...)``). ``create_colocated_worker_raw_cls`` returns that fused class
itself, not yet wrapped for Ray.
"""

from __future__ import annotations

import functools
import os
from contextlib import contextmanager

from verl.single_controller.base.decorator import MAGIC_ATTR
from verl.single_controller.base.worker import ENV_DISABLE_WORKER_INIT, Worker
from verl.single_controller.base.worker_group import _unwrap_cls
from verl.single_controller.ray.resource import RayClassWithInitArgs


@contextmanager
def _env(key: str, value: str):
    old = os.environ.get(key)
    os.environ[key] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = old


def _collect(class_dict: dict) -> tuple[dict, dict]:
    if not class_dict:
        raise ValueError("class_dict is empty: pass {role_name: RayClassWithInitArgs(WorkerClass, ...)}")
    classes, init_args = {}, {}
    for role, cia in class_dict.items():
        if not isinstance(cia, RayClassWithInitArgs):
            raise TypeError(f"class_dict[{role!r}] must be a RayClassWithInitArgs, got {type(cia).__name__}")
        cls = _unwrap_cls(cia.cls)
        if not (isinstance(cls, type) and issubclass(cls, Worker)):
            raise TypeError(f"class_dict[{role!r}]: {cls!r} must subclass verl.single_controller.base.Worker")
        classes[role] = cls
        init_args[role] = (cia.args, cia.kwargs)
    return classes, init_args


def _build_roles(classes: dict, init_args: dict) -> dict:
    roles = {}
    with _env(ENV_DISABLE_WORKER_INIT, "1"):
        for role, cls in classes.items():
            args, kwargs = init_args[role]
            roles[role] = cls(*args, **kwargs)
    return roles


def _registered_methods(cls) -> dict:
    out = {}
    for name in dir(cls):
        try:
            method = getattr(cls, name)
        except Exception:
            continue
        attrs = getattr(method, MAGIC_ATTR, None) if callable(method) else None
        if attrs is not None:
            out[name] = (method, attrs)
    return out


def _make_role_method(role: str, name: str, method, attrs: dict):
    # Futures are materialized by the role method's own @register wrapper.
    def func(self, *args, **kwargs):
        return getattr(self.worker_dict[role], name)(*args, **kwargs)

    functools.update_wrapper(func, method)
    func.__name__ = f"{role}_{name}"
    setattr(func, MAGIC_ATTR, attrs)
    return func


def create_colocated_worker_cls(class_dict: dict[str, RayClassWithInitArgs]) -> RayClassWithInitArgs:
    """One worker class hosting every role of ``class_dict``; methods are named ``{role}_{method}``."""
    classes, init_args = _collect(class_dict)

    class WorkerDict(Worker):
        _verl_colocated_roles = dict(classes)
        _verl_role_methods: dict = {}

        def __init__(self):
            super().__init__()
            self.worker_dict = _build_roles(classes, init_args)

    role_methods = {}
    for role, cls in classes.items():
        names = []
        for name, (method, attrs) in _registered_methods(cls).items():
            setattr(WorkerDict, f"{role}_{name}", _make_role_method(role, name, method, attrs))
            names.append(name)
        role_methods[role] = names
    WorkerDict._verl_role_methods = role_methods
    WorkerDict.__name__ = WorkerDict.__qualname__ = "WorkerDict_" + "_".join(classes)
    return RayClassWithInitArgs(cls=WorkerDict)


FusedWorkerCLSName = "FusedWorker"  # verl's prefix of the fused class name: FusedWorker_actor_critic


def create_colocated_worker_raw_cls(class_dict: dict[str, RayClassWithInitArgs]) -> type:
    """The plain (not ``ray.remote``) fused worker class hosting every role of ``class_dict``.

    Its instance holds one instance per role in ``fused_worker_dict`` (also as attribute ``self.<role>``), and
    ``_fuw_execute(role, method, *args)`` calls a role's method; ``raw_cls_dict`` maps role -> user class.
    Every role instance gets ``fused_worker_dict`` too, so colocated roles can reach each other in-process.
    Use it to build the actor yourself (e.g. with other Ray options); :func:`create_colocated_worker_cls_fused`
    wraps it for a ``RayWorkerGroup``.
    """
    classes, init_args = _collect(class_dict)

    class FusedWorker(Worker):
        _verl_fused_roles = dict(classes)
        raw_cls_dict = dict(classes)
        is_fused_worker = True

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.worker_dict = _build_roles(classes, init_args)
            self.fused_worker_dict = self.worker_dict  # verl's attribute name
            for role, instance in self.worker_dict.items():
                setattr(self, role, instance)
                instance.fused_worker_dict = self.worker_dict

        def _fuw_execute(self, role: str, method_name: str, *args, **kwargs):
            if role not in self.worker_dict:
                raise ValueError(f"fused worker has no role {role!r}; roles: {sorted(self.worker_dict)}")
            return getattr(self.worker_dict[role], method_name)(*args, **kwargs)

    FusedWorker.__name__ = FusedWorker.__qualname__ = "_".join([FusedWorkerCLSName, *classes])
    return FusedWorker


def create_colocated_worker_cls_fused(class_dict: dict[str, RayClassWithInitArgs]) -> RayClassWithInitArgs:
    """Like ``create_colocated_worker_cls`` but role methods stay behind one entry point
    (the class of :func:`create_colocated_worker_raw_cls`, ready for ``RayWorkerGroup``)."""
    cia = RayClassWithInitArgs(cls=create_colocated_worker_raw_cls(class_dict))
    cia.fused_worker_used = True
    return cia
