"""Equality, union and merge of the containers a DataProto holds (re-exported by :mod:`verl.protocol`).

``union`` of two batches needs "are these equal?" for tensors, object arrays and nested meta values (NaN
equal to NaN); ``concat`` needs per-worker metrics merged into one list per name.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict


def _deep_equal(a: Any, b: Any) -> bool:
    """Equality that works for tensors, arrays (NaN == NaN) and containers of them."""
    if a is b:
        return True
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return False
        if a.shape != b.shape or a.dtype != b.dtype or a.device != b.device:
            return False
        if torch.equal(a, b):
            return True
        same_nans = torch.equal(a.isnan(), b.isnan()) if a.is_floating_point() else False
        return bool(same_nans and torch.equal(a.nan_to_num(0.0), b.nan_to_num(0.0)))
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        a_arr, b_arr = np.asarray(a), np.asarray(b)
        if a_arr.shape != b_arr.shape:
            return False
        if a_arr.dtype == object or b_arr.dtype == object:
            return all(_deep_equal(x, y) for x, y in zip(a_arr.ravel(), b_arr.ravel()))
        return bool(np.array_equal(a_arr, b_arr, equal_nan=a_arr.dtype.kind in "fc"))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_deep_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_deep_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    try:
        return bool(a == b)
    except Exception:  # objects whose __eq__ is not a plain bool
        return False


def _to_object_array(values: Any, key: str) -> np.ndarray:
    """One-dimensional object array of per-sample values (lists of equal-length lists stay 1-D)."""
    if isinstance(values, np.ndarray):
        return values if values.dtype == object else values.astype(object)
    if isinstance(values, (list, tuple)):
        arr = np.empty(len(values), dtype=object)
        for i, v in enumerate(values):
            arr[i] = v
        return arr
    raise TypeError(
        f"non_tensor_batch[{key!r}] must be a numpy array (dtype=object) or a list with one entry per sample, "
        f"got {type(values).__name__}"
    )


def union_two_dict(dict1: dict, dict2: dict) -> dict:
    """Merge ``dict2`` into ``dict1``; a key present in both must hold equal values."""
    for key, val in dict2.items():
        if key in dict1 and not _deep_equal(dict1[key], val):
            raise ValueError(f"union: key {key!r} is in both meta_info dicts with different values "
                             f"({dict1[key]!r} vs {val!r}); rename one or pop it before union")
        dict1[key] = val
    return dict1


def union_tensor_dict(tensor_dict1: TensorDict, tensor_dict2: TensorDict) -> TensorDict:
    """Add the tensors of ``tensor_dict2`` to ``tensor_dict1``; shared keys must hold equal tensors."""
    if tensor_dict1.batch_size != tensor_dict2.batch_size:
        raise ValueError(f"union: batch sizes differ: {tuple(tensor_dict1.batch_size)} vs "
                         f"{tuple(tensor_dict2.batch_size)}")
    for key in tensor_dict2.keys():
        if key in tensor_dict1.keys():
            if not _deep_equal(tensor_dict1[key], tensor_dict2[key]):
                raise ValueError(f"union: tensor {key!r} exists in both batches with different values; "
                                 f"pop or rename it on one side first")
        else:
            tensor_dict1[key] = tensor_dict2[key]
    return tensor_dict1


def union_numpy_dict(tensor_dict1: dict[str, np.ndarray], tensor_dict2: dict[str, np.ndarray]) -> dict:
    """Add the arrays of ``tensor_dict2`` to ``tensor_dict1``; shared keys must hold equal arrays."""
    for key, val in tensor_dict2.items():
        if key in tensor_dict1:
            if not isinstance(val, np.ndarray) or not _deep_equal(tensor_dict1[key], val):
                raise ValueError(f"union: non-tensor {key!r} exists in both batches with different values; "
                                 f"pop or rename it on one side first")
        tensor_dict1[key] = val
    return tensor_dict1


def list_of_dict_to_dict_of_list(list_of_dict: list[dict]) -> dict[str, list]:
    """``[{"a": 1}, {"a": 2}] -> {"a": [1, 2]}``; keys are taken from the union of all dicts."""
    output: dict[str, list] = {}
    for d in list_of_dict:
        for key, val in d.items():
            output.setdefault(key, []).append(val)
    return output


def _merge_metrics(parts: list) -> dict[str, list]:
    """Metrics from several workers -> one list per metric name (per-worker lists are flattened)."""
    merged: dict[str, list] = {}
    for part in parts:
        for d in part if isinstance(part, list) else [part]:
            for name, val in d.items():
                bucket = merged.setdefault(name, [])
                bucket.extend(val) if isinstance(val, (list, tuple)) else bucket.append(val)
    return merged
