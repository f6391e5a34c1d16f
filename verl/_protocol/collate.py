"""Building a batch from samples and all-gathering one across ranks (re-exported by :mod:`verl.protocol`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.distributed as dist
from tensordict import TensorDict

from verl._protocol.containers import _to_object_array, list_of_dict_to_dict_of_list

if TYPE_CHECKING:  # the class lives in verl.protocol, which imports this module
    from verl.protocol import DataProto


def collate_items(items: list) -> tuple:
    """DataProtoItems -> ``(stacked batch or None, {key: object array}, meta_info of the first)``."""
    batch = torch.stack([item.batch for item in items]) if items[0].batch is not None else None
    non_tensor = list_of_dict_to_dict_of_list([item.non_tensor_batch for item in items])
    return batch, {k: _to_object_array(v, k) for k, v in non_tensor.items()}, items[0].meta_info


def collate_rows(x: list) -> dict:
    """Dataset rows (dicts) -> one dict: tensors stacked, every other value an object array."""
    tensors, non_tensors = {}, {}
    for row in x:
        for key, val in row.items():
            (tensors if isinstance(val, torch.Tensor) else non_tensors).setdefault(key, []).append(val)
    out = {}
    for key, vals in tensors.items():
        if len(vals) != len(x):
            raise ValueError(f"collate_fn: tensor {key!r} is missing from {len(x) - len(vals)} of {len(x)} samples")
        out[key] = torch.stack(vals, dim=0)
    for key, vals in non_tensors.items():
        out[key] = _to_object_array(vals, key)
    return out


def all_gather_data_proto(data: DataProto, process_group=None) -> None:
    """All-gather ``data`` across ``process_group`` in place (every rank ends with every rank's rows, in
    rank order). Every rank must hold the same number of rows."""
    world = dist.get_world_size(group=process_group)
    if data.batch is not None:
        gathered = {}
        for key, t in data.batch.items(True, True):
            parts = [torch.empty_like(t) for _ in range(world)]
            dist.all_gather(parts, t.contiguous(), group=process_group)
            gathered[key] = torch.cat(parts, dim=0)
        data.batch = TensorDict(gathered, batch_size=(len(data) * world,), device=data.batch.device).unflatten_keys()
    objects = [None] * world
    dist.all_gather_object(objects, data.non_tensor_batch, group=process_group)
    data.non_tensor_batch = {k: np.concatenate([o[k] for o in objects], axis=0) for k in data.non_tensor_batch}
