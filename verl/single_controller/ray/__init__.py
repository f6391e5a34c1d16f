"""Ray backend: RayResourcePool, RayClassWithInitArgs, RayWorkerGroup, colocated roles, resource pools.

``Role`` is still importable from here (verl keeps it in :mod:`verl.trainer.ppo.utils`); it is resolved on
first use so that importing the single controller does not import the trainer.
"""

import importlib

from verl.single_controller.ray.base import (
    RayClassWithInitArgs,
    RayResourcePool,
    RayWorkerGroup,
    ResourcePoolManager,
    WorkerError,
    create_colocated_worker_cls,
    create_colocated_worker_cls_fused,
)

__all__ = [
    "RayClassWithInitArgs",
    "RayResourcePool",
    "RayWorkerGroup",
    "ResourcePoolManager",
    "WorkerError",
    "create_colocated_worker_cls",
    "create_colocated_worker_cls_fused",
]


def __getattr__(name: str):
    if name == "Role":
        return importlib.import_module("verl.trainer.ppo.utils").Role
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
