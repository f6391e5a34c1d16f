"""Ray backend: RayResourcePool, RayClassWithInitArgs, RayWorkerGroup, colocated roles, Role/pools."""

from verl.single_controller.ray.base import (
    RayClassWithInitArgs,
    RayResourcePool,
    RayWorkerGroup,
    ResourcePoolManager,
    Role,
    WorkerError,
    create_colocated_worker_cls,
    create_colocated_worker_cls_fused,
)

__all__ = [
    "RayClassWithInitArgs",
    "RayResourcePool",
    "RayWorkerGroup",
    "ResourcePoolManager",
    "Role",
    "WorkerError",
    "create_colocated_worker_cls",
    "create_colocated_worker_cls_fused",
]
