"""Group statistics without Python loops: the building blocks of the vectorised group estimators.

``as_torch_index`` turns any group labels (prompt uids as strings, UUIDs, ints, floats, tensors) into ids
0..G-1; ``group_mean_std`` returns each group's mean, Bessel-corrected std and size with scatter-adds, so an
estimator like GRPO costs a few tensor ops however many prompts a batch holds.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch

__all__ = ["as_torch_index", "group_mean_std"]


def _target_device(device: torch.device | str | None, fallback: torch.device | None = None) -> torch.device:
    """``device`` if given, else env ``VERL_FORCE_DEVICE``, else ``fallback`` (CPU when None)."""
    if device is not None:
        return torch.device(device)
    forced = os.environ.get("VERL_FORCE_DEVICE")
    if forced:
        return torch.device(forced)
    return fallback if fallback is not None else torch.device("cpu")


def _labels(index: Any) -> np.ndarray:
    if isinstance(index, torch.Tensor):
        index = index.detach().cpu().reshape(-1).tolist()
    arr = np.asarray(index) if not isinstance(index, np.ndarray) else index
    if arr.dtype == object or arr.ndim != 1:
        flat = np.empty(len(index), dtype=object)
        for i, label in enumerate(index):
            flat[i] = label
        arr = flat
    return arr


def as_torch_index(index: Any, device: torch.device | str | None = None) -> torch.Tensor:
    """Group labels -> ``torch.long`` ids in 0..G-1 (same label, same id).

    Integer labels (and floats within 1e-6 of an integer) are used as ids directly, as in verl; any other
    labels (strings, UUIDs, mixed objects) are numbered in sorted order of their string form.
    """
    target = _target_device(device)
    arr = _labels(index)
    if arr.dtype.kind in "iub":
        return torch.as_tensor(arr.astype(np.int64), device=target)
    if arr.dtype.kind == "f":
        rounded = np.rint(arr.astype(np.float64))
        if np.allclose(arr, rounded, rtol=0.0, atol=1e-6):
            return torch.as_tensor(rounded.astype(np.int64), device=target)
    keys = np.array([str(x) for x in arr], dtype=object)
    _, ids = np.unique(keys, return_inverse=True)
    return torch.as_tensor(ids.astype(np.int64).reshape(-1), device=target)


@torch.no_grad()
def group_mean_std(scores: torch.Tensor, gidx: torch.Tensor, eps: float = 1e-6,
                   device: torch.device | str | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-group ``(mean, std, count)``, each of shape (G,) with G = max(gidx) + 1.

    std is the unbiased (n - 1) standard deviation with the variance floored at ``eps``; a group of one sample
    gets mean 0 and std 1 (its advantage is then its own score), as verl's loop estimators do. Computed in
    float32, or in the scores' dtype when that is wider (float64 stays float64).
    """
    target = _target_device(device, scores.device)
    dtype = torch.promote_types(scores.dtype, torch.float32)
    scores = scores.reshape(-1).to(device=target, dtype=dtype)
    gidx = gidx.reshape(-1).to(device=target, dtype=torch.long)
    if scores.numel() != gidx.numel():
        raise ValueError(f"scores and gidx length mismatch: {scores.numel()} vs {gidx.numel()}")
    num_groups = int(gidx.max().item()) + 1 if gidx.numel() else 0
    count = torch.zeros(num_groups, device=target, dtype=dtype).index_add_(0, gidx, torch.ones_like(scores))
    total = torch.zeros(num_groups, device=target, dtype=dtype).index_add_(0, gidx, scores)
    mean = total / count.clamp_min(1.0)
    sq_dev = torch.zeros(num_groups, device=target, dtype=dtype).index_add_(0, gidx, (scores - mean[gidx]) ** 2)
    std = (sq_dev / (count - 1.0).clamp_min(1.0)).clamp_min(eps).sqrt()
    single = count <= 1.0
    mean = torch.where(single, torch.zeros_like(mean), mean)
    std = torch.where(single, torch.ones_like(std), std)
    return mean, std, count
