"""Base of the training-engine -> rollout-engine handoffs (verl's ``BaseShardingManager``)."""

from __future__ import annotations

from verl.protocol import DataProto

__all__ = ["BaseShardingManager"]


class BaseShardingManager:
    """A context manager around generation: ``__enter__`` readies the rollout engine (weights, memory),
    ``__exit__`` frees what generation used. ``preprocess_data`` / ``postprocess_data`` reshape a batch between
    the training layout and the rollout layout (identity when both are plain data parallel, as here)."""

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        return False

    def preprocess_data(self, data: DataProto) -> DataProto:
        return data

    def postprocess_data(self, data: DataProto) -> DataProto:
        return data
