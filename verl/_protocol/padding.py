"""Padding a DataProto to a multiple of the world size, and folding its batch dimension
(re-exported by :mod:`verl.protocol`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # the class lives in verl.protocol, which imports this module
    from verl.protocol import DataProto


def pad_dataproto_to_divisor(data: DataProto, size_divisor: int) -> tuple[DataProto, int]:
    """Pad ``data`` by repeating its rows from the start until its length is a multiple of ``size_divisor``.

    Returns ``(padded, pad_size)``; ``unpad_dataproto(output, pad_size)`` drops the padded rows again.
    """
    if size_divisor < 1:
        raise ValueError(f"size_divisor must be >= 1, got {size_divisor}")
    pad_size = (-len(data)) % size_divisor
    if pad_size == 0:
        return data, 0
    if len(data) == 0:
        raise ValueError("pad_dataproto_to_divisor: cannot pad an empty DataProto (no rows to repeat)")
    padded = type(data).concat([data, data.select_idxs(np.arange(pad_size) % len(data))])
    return padded, pad_size


def unpad_dataproto(data: DataProto, pad_size: int) -> DataProto:
    """Drop the last ``pad_size`` rows (undo ``pad_dataproto_to_divisor``)."""
    return data[:-pad_size] if pad_size else data


def fold_batch_dim(data: DataProto, new_batch_size: int) -> DataProto:
    """Reshape the batch ``(B, ...)`` into ``(new_batch_size, B // new_batch_size, ...)``."""
    if len(data) % new_batch_size != 0:
        raise ValueError(f"fold_batch_dim: batch size {len(data)} is not divisible by {new_batch_size}")
    inner = len(data) // new_batch_size
    batch = None
    if data.batch is not None:
        batch = data.batch.reshape(new_batch_size, inner)
    non_tensor = {k: v.reshape(new_batch_size, inner, *v.shape[1:]) for k, v in data.non_tensor_batch.items()}
    return type(data)(batch=batch, non_tensor_batch=non_tensor, meta_info=data.meta_info)


def unfold_batch_dim(data: DataProto, batch_dims: int = 2) -> DataProto:
    """Flatten the first ``batch_dims`` dims back into one batch dim (undo ``fold_batch_dim``)."""
    batch = None
    if data.batch is not None:
        batch = data.batch.reshape(-1) if batch_dims > 1 else data.batch
    non_tensor = {k: v.reshape(-1, *v.shape[batch_dims:]) for k, v in data.non_tensor_batch.items()}
    return type(data)(batch=batch, non_tensor_batch=non_tensor, meta_info=data.meta_info)
