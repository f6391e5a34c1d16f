"""Single-controller core: one driver process drives groups of worker processes through method calls.

``base`` holds the backend-neutral pieces (Worker, WorkerGroup, ResourcePool, the @register decorator);
``ray`` is the Ray backend (RayResourcePool, RayWorkerGroup, colocated roles).
"""

from verl.single_controller.base import ClassWithInitArgs, ResourcePool, Worker, WorkerGroup

__all__ = ["ClassWithInitArgs", "ResourcePool", "Worker", "WorkerGroup"]
