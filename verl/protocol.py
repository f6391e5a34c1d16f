"""DataProto: the one data container that flows between the driver and every worker.

The single controller (the driver) never touches model internals; it moves batches between worker groups.
Every such batch is a ``DataProto``:

* ``batch`` -- a ``tensordict.TensorDict`` of equally long tensors (``input_ids``, ``attention_mask``, ...),
* ``non_tensor_batch`` -- per-sample Python objects (raw prompts, ground truths, uids) as numpy object arrays,
  indexed along the same first dimension as ``batch``,
* ``meta_info`` -- batch-level settings and results (``temperature``, ``eos_token_id``, ``metrics``).

Because all three travel together, the dispatch layer can split a batch across data-parallel ranks
(``chunk``), gather results back (``concat``) and the driver can align rollouts with prompts
(``repeat`` + ``union``) without knowing what is inside. ``DataProtoFuture`` is the lazy version of the same
thing for non-blocking worker calls: the data stays in Ray's object store until someone calls ``.get()``.
"""

from __future__ import annotations

import copy
import io
import math
import os
import pickle
import tempfile
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch
from tensordict import TensorDict

__all__ = [
    "DataProto",
    "DataProtoConfig",
    "DataProtoFuture",
    "DataProtoItem",
    "all_gather_data_proto",
    "collate_fn",
    "fold_batch_dim",
    "list_of_dict_to_dict_of_list",
    "pad_dataproto_to_divisor",
    "union_numpy_dict",
    "union_tensor_dict",
    "union_two_dict",
    "unfold_batch_dim",
    "unpad_dataproto",
]


# --------------------------------------------------------------------------------------------------- config
class _DataProtoConfigMeta(type):
    """Gives ``DataProtoConfig.auto_padding`` a class-level getter/setter that also reads the environment."""

    _config: dict = {}
    auto_padding_key = "_verl_auto_padding"

    @property
    def auto_padding(cls) -> bool:
        from_env = os.getenv("VERL_AUTO_PADDING", "FALSE").strip().upper() in ("TRUE", "1", "YES")
        return from_env or bool(cls._config.get(cls.auto_padding_key, False))

    @auto_padding.setter
    def auto_padding(cls, enabled: bool) -> None:
        if not isinstance(enabled, bool):
            raise TypeError(f"DataProtoConfig.auto_padding must be a bool, got {enabled!r}")
        cls._config[cls.auto_padding_key] = enabled


class DataProtoConfig(metaclass=_DataProtoConfigMeta):
    """Process-wide switches. ``auto_padding`` (or env ``VERL_AUTO_PADDING=1``) lets ``chunk`` accept batch
    sizes that are not a multiple of the world size; the dispatch layer then pads before and unpads after."""


# -------------------------------------------------------------------------------------------------- helpers
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


def _compact(t: torch.Tensor) -> torch.Tensor:
    """A tensor that owns exactly its bytes: pickling a view would otherwise ship its whole base storage."""
    if t.is_contiguous() and t.storage_offset() == 0 and t.untyped_storage().nbytes() == t.numel() * t.element_size():
        return t
    return t.clone(memory_format=torch.contiguous_format)


def _take_rows(batch: TensorDict | None, index: torch.Tensor) -> TensorDict | None:
    """``batch[index]`` with the index moved to the batch's device first."""
    if batch is None:
        return None
    return batch[index.to(batch.device) if batch.device is not None else index]


def _split_sizes(total: int, chunks: int) -> list[int]:
    """``chunks`` sizes that add up to ``total`` and differ by at most one (larger ones first)."""
    base, extra = divmod(total, chunks)
    return [base + 1 if i < extra else base for i in range(chunks)]


# ------------------------------------------------------------------------------------------------ DataProto
@dataclass
class DataProtoItem:
    """One sample of a DataProto (what ``data[i]`` returns)."""

    batch: TensorDict | None = None
    non_tensor_batch: dict = field(default_factory=dict)
    meta_info: dict = field(default_factory=dict)


@dataclass
class DataProto:
    """A batch of samples: tensors in ``batch``, Python objects in ``non_tensor_batch``, settings in ``meta_info``.

    All tensors and non-tensor arrays share the first (batch) dimension; the constructor checks that.
    """

    batch: TensorDict | None = None
    non_tensor_batch: dict[str, np.ndarray] = field(default_factory=dict)
    meta_info: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.non_tensor_batch is None:
            self.non_tensor_batch = {}
        if self.meta_info is None:
            self.meta_info = {}
        self.non_tensor_batch = {k: _to_object_array(v, k) for k, v in self.non_tensor_batch.items()}
        self.check_consistency()

    # ---------------------------------------------------------------------------------- construction
    @classmethod
    def from_dict(cls, tensors: dict | None = None, non_tensors: dict | None = None, meta_info: dict | None = None,
                  num_batch_dims: int = 1, auto_padding: bool = False) -> "DataProto":
        """Build from ``{name: tensor}`` (+ per-sample objects); the first ``num_batch_dims`` dims are the batch."""
        if num_batch_dims < 1:
            raise ValueError(f"num_batch_dims must be >= 1, got {num_batch_dims}")
        tensors, non_tensors, meta_info = tensors or {}, non_tensors or {}, dict(meta_info or {})
        if non_tensors and num_batch_dims != 1:
            raise ValueError(f"non_tensors need num_batch_dims=1, got {num_batch_dims}")
        batch = None
        if tensors:
            batch_size = None
            for key, t in tensors.items():
                if not isinstance(t, torch.Tensor):
                    raise TypeError(f"tensors[{key!r}] must be a torch.Tensor, got {type(t).__name__}; "
                                    f"put per-sample Python objects in non_tensors")
                if t.dim() < num_batch_dims:
                    raise ValueError(f"tensors[{key!r}] has {t.dim()} dims, fewer than num_batch_dims={num_batch_dims}")
                shape = tuple(t.shape[:num_batch_dims])
                if batch_size is None:
                    batch_size, first_key = shape, key
                elif shape != batch_size:
                    raise ValueError(f"tensors[{key!r}] has batch shape {shape} but tensors[{first_key!r}] has "
                                     f"{batch_size}; every tensor needs the same leading dims")
            batch = TensorDict(source=dict(tensors), batch_size=batch_size)
        if auto_padding:
            meta_info[DataProtoConfig.auto_padding_key] = True
        return cls(batch=batch, non_tensor_batch=dict(non_tensors), meta_info=meta_info)

    @classmethod
    def from_single_dict(cls, data: dict, meta_info: dict | None = None, auto_padding: bool = False) -> "DataProto":
        """Build from one dict (e.g. a dataloader batch): tensors go to ``batch``, numpy arrays/lists to
        ``non_tensor_batch``."""
        tensors, non_tensors = {}, {}
        for key, val in data.items():
            if isinstance(val, torch.Tensor):
                tensors[key] = val
            elif isinstance(val, (np.ndarray, list, tuple)):
                non_tensors[key] = val
            else:
                raise TypeError(f"from_single_dict: {key!r} is a {type(val).__name__}; expected a torch.Tensor or "
                                f"a numpy array / list with one entry per sample (put scalars in meta_info)")
        return cls.from_dict(tensors, non_tensors, meta_info, auto_padding=auto_padding)

    def check_consistency(self) -> None:
        """Raise ValueError unless every tensor and non-tensor array has the same batch length."""
        if self.batch is not None and not isinstance(self.batch, TensorDict):
            raise TypeError(f"DataProto.batch must be a TensorDict or None, got {type(self.batch).__name__}")
        if self.batch is not None and len(self.batch.batch_size) == 0:
            raise ValueError("DataProto.batch needs a batch dimension (batch_size is empty)")
        expected = tuple(self.batch.batch_size) if self.batch is not None else None
        for key, val in self.non_tensor_batch.items():
            if not isinstance(val, np.ndarray) or val.dtype != object:
                raise TypeError(f"non_tensor_batch[{key!r}] must be a numpy array with dtype=object, "
                                f"got {type(val).__name__}")
            if val.ndim == 0:
                raise ValueError(f"non_tensor_batch[{key!r}] is 0-d; it needs one entry per sample")
            if expected is None:
                expected, first = (val.shape[0],), key
            if tuple(val.shape[:len(expected)]) != expected:
                where = "batch" if self.batch is not None else f"non_tensor_batch[{first!r}]"
                raise ValueError(f"non_tensor_batch[{key!r}] has length {val.shape[0]} but {where} has batch size "
                                 f"{expected}; every entry needs one value per sample")

    # ------------------------------------------------------------------------------------- basics
    def __len__(self) -> int:
        if self.batch is not None:
            return self.batch.batch_size[0]
        if self.non_tensor_batch:
            return next(iter(self.non_tensor_batch.values())).shape[0]
        return 0

    def __getitem__(self, item):
        if isinstance(item, slice):
            return self.slice(item.start, item.stop, item.step)
        if isinstance(item, (list, np.ndarray, torch.Tensor)):
            return self.select_idxs(item)
        if isinstance(item, (int, np.integer)):
            batch = self.batch[int(item)] if self.batch is not None else None
            non_tensor = {k: v[item] for k, v in self.non_tensor_batch.items()}
            return DataProtoItem(batch=batch, non_tensor_batch=non_tensor, meta_info=self.meta_info)
        raise TypeError(f"DataProto indices must be int, slice, list, numpy array or torch tensor, "
                        f"got {type(item).__name__}")

    def __iter__(self):
        for i in range(len(self)):
            yield self[i]

    def _new(self, batch, non_tensor_batch, meta_info=None) -> "DataProto":
        meta = dict(self.meta_info) if meta_info is None else meta_info
        return type(self)(batch=batch, non_tensor_batch=non_tensor_batch, meta_info=meta)

    def is_padding_enabled(self) -> bool:
        """Auto padding is on for this batch (meta flag) or for the whole process (DataProtoConfig)."""
        return bool(self.meta_info.get(DataProtoConfig.auto_padding_key, False)) or DataProtoConfig.auto_padding

    def to(self, device) -> "DataProto":
        """Move the tensors to ``device`` (non-tensors stay where they are). Returns self."""
        if self.batch is not None:
            self.batch = self.batch.to(device)
        return self

    def print_size(self, prefix: str = "") -> None:
        """Print the memory held by tensors and by numpy arrays, in GB."""
        tensor_bytes = 0 if self.batch is None else sum(t.numel() * t.element_size()
                                                        for t in self.batch.values(True, True))
        numpy_bytes = sum(v.nbytes for v in self.non_tensor_batch.values())
        print(f"{prefix}size of tensordict: {tensor_bytes / 1024**3} GB, "
              f"size of non_tensor_batch: {numpy_bytes / 1024**3} GB")

    def get_data_info(self) -> str:
        """Human-readable list of keys, shapes and dtypes."""
        lines = [f"DataProto(len={len(self)})", "batch:"]
        if self.batch is not None:
            for key, t in self.batch.items(True, True):
                lines.append(f"  {key}: shape={tuple(t.shape)}, dtype={t.dtype}, device={t.device}")
        lines.append("non_tensor_batch:")
        for key, v in self.non_tensor_batch.items():
            lines.append(f"  {key}: shape={v.shape}, dtype={v.dtype}")
        lines.append(f"meta_info: {sorted(self.meta_info)}")
        return "\n".join(lines)

    def to_tensordict(self) -> TensorDict:
        """One TensorDict holding the tensors plus the non-tensors (as NonTensorStack) and meta_info."""
        from tensordict import NonTensorData, NonTensorStack

        td = self.batch.clone(recurse=False) if self.batch is not None else TensorDict({}, batch_size=(len(self),))
        for key, val in self.non_tensor_batch.items():
            td[key] = NonTensorStack(*[NonTensorData(x) for x in val], batch_size=(len(self),))
        for key, val in self.meta_info.items():
            td.set_non_tensor(key, val)
        return td

    # ----------------------------------------------------------------------------------- selection
    def select(self, batch_keys=None, non_tensor_batch_keys=None, meta_info_keys=None, deepcopy=False) -> "DataProto":
        """Subset of keys (``None`` keeps all of that part). ``deepcopy`` copies non-tensors and meta_info."""
        for keys, pool, part in ((batch_keys, self.batch.keys() if self.batch is not None else [], "batch"),
                                 (non_tensor_batch_keys, self.non_tensor_batch, "non_tensor_batch"),
                                 (meta_info_keys, self.meta_info, "meta_info")):
            missing = [k for k in (keys or []) if k not in pool]
            if missing:
                raise KeyError(f"select: {missing} not in {part}; available: {sorted(pool)}")
        batch = self.batch.select(*batch_keys) if batch_keys is not None and self.batch is not None else self.batch
        non_tensor = self.non_tensor_batch if non_tensor_batch_keys is None else {
            k: self.non_tensor_batch[k] for k in non_tensor_batch_keys}
        meta = self.meta_info if meta_info_keys is None else {k: self.meta_info[k] for k in meta_info_keys}
        if deepcopy:
            non_tensor, meta = copy.deepcopy(non_tensor), copy.deepcopy(meta)
        else:
            non_tensor, meta = dict(non_tensor), dict(meta)
        return type(self)(batch=batch, non_tensor_batch=non_tensor, meta_info=meta)

    def select_idxs(self, idxs) -> "DataProto":
        """Rows picked by an index array (ints) or a boolean mask."""
        if isinstance(idxs, torch.Tensor):
            idx_t = idxs.detach().cpu()
        else:
            arr = np.asarray(idxs)
            idx_t = torch.from_numpy(arr.astype(bool) if arr.dtype == bool else arr.astype(np.int64).reshape(-1))
        if idx_t.dtype == torch.bool:
            if idx_t.shape != (len(self),):
                raise IndexError(f"boolean mask has shape {tuple(idx_t.shape)}, expected ({len(self)},)")
        else:
            idx_t = idx_t.long().reshape(-1)
        idx_np = idx_t.numpy()
        batch = _take_rows(self.batch, idx_t)
        non_tensor = {k: v[idx_np] for k, v in self.non_tensor_batch.items()}
        return self._new(batch, non_tensor)

    def slice(self, start=None, end=None, step=None) -> "DataProto":
        """Rows ``start:end:step`` (views, no copy of the tensors)."""
        s = slice(start, end, step)
        batch = self.batch[s] if self.batch is not None else None
        return self._new(batch, {k: v[s] for k, v in self.non_tensor_batch.items()})

    def pop(self, batch_keys=None, non_tensor_batch_keys=None, meta_info_keys=None) -> "DataProto":
        """Remove the named keys from self and return them as a new DataProto."""
        tensors = {}
        for key in batch_keys or []:
            if self.batch is None or key not in self.batch.keys():
                raise KeyError(f"pop: {key!r} not in batch; available: {self._batch_keys()}")
            tensors[key] = self.batch.pop(key)
        non_tensors = {}
        for key in non_tensor_batch_keys or []:
            if key not in self.non_tensor_batch:
                raise KeyError(f"pop: {key!r} not in non_tensor_batch; available: {sorted(self.non_tensor_batch)}")
            non_tensors[key] = self.non_tensor_batch.pop(key)
        meta = {}
        for key in meta_info_keys or []:
            if key not in self.meta_info:
                raise KeyError(f"pop: {key!r} not in meta_info; available: {sorted(self.meta_info)}")
            meta[key] = self.meta_info.pop(key)
        if tensors:
            batch = TensorDict(tensors, batch_size=self.batch.batch_size, device=self.batch.device)
            return type(self)(batch=batch, non_tensor_batch=non_tensors, meta_info=meta)
        return type(self)(batch=None, non_tensor_batch=non_tensors, meta_info=meta)

    def _batch_keys(self) -> list:
        return sorted(self.batch.keys()) if self.batch is not None else []

    def rename(self, old_keys=None, new_keys=None) -> "DataProto":
        """Rename keys in place (tensor keys, or non-tensor keys). Returns self."""
        old_keys = [old_keys] if isinstance(old_keys, str) else list(old_keys or [])
        new_keys = [new_keys] if isinstance(new_keys, str) else list(new_keys or [])
        if len(old_keys) != len(new_keys):
            raise ValueError(f"rename: {len(old_keys)} old keys but {len(new_keys)} new keys")
        for old, new in zip(old_keys, new_keys):
            if self.batch is not None and old in self.batch.keys():
                self.batch.rename_key_(old, new)
            elif old in self.non_tensor_batch:
                self.non_tensor_batch[new] = self.non_tensor_batch.pop(old)
            else:
                raise KeyError(f"rename: {old!r} is in neither batch {self._batch_keys()} nor "
                               f"non_tensor_batch {sorted(self.non_tensor_batch)}")
        return self

    # ----------------------------------------------------------------------------------- combining
    def union(self, other: "DataProto") -> "DataProto":
        """Add ``other``'s keys to self (in place, returns self). Shared keys must hold equal values."""
        if self.batch is None:
            self.batch = other.batch
        elif other.batch is not None:
            self.batch = union_tensor_dict(self.batch, other.batch)
        if self.non_tensor_batch and other.non_tensor_batch and len(self) != len(other):
            raise ValueError(f"union: lengths differ ({len(self)} vs {len(other)})")
        self.non_tensor_batch = union_numpy_dict(self.non_tensor_batch, other.non_tensor_batch)
        self.meta_info = union_two_dict(self.meta_info, other.meta_info)
        self.check_consistency()
        return self

    def chunk(self, chunks: int) -> list["DataProto"]:
        """Split into ``chunks`` parts along the batch (the dispatch to data-parallel ranks).

        The length must be divisible by ``chunks`` unless auto padding is on; then sizes differ by at most one.
        """
        if not isinstance(chunks, int) or chunks < 1:
            raise ValueError(f"chunk: chunks must be a positive int, got {chunks!r}")
        if len(self) % chunks != 0 and not self.is_padding_enabled():
            raise ValueError(
                f"chunk: batch size {len(self)} is not divisible by chunks={chunks}. Make the batch size a "
                f"multiple of {chunks}, pad it with pad_dataproto_to_divisor, or enable auto padding "
                f"(DataProtoConfig.auto_padding = True / env VERL_AUTO_PADDING=1)")
        bounds = np.cumsum([0] + _split_sizes(len(self), chunks))
        return [self.slice(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]

    def split(self, split_size: int) -> list["DataProto"]:
        """Consecutive parts of ``split_size`` rows (the last one may be shorter)."""
        if split_size < 1:
            raise ValueError(f"split: split_size must be >= 1, got {split_size}")
        return [self.slice(i, i + split_size) for i in range(0, len(self), split_size)]

    @staticmethod
    def concat(data: list["DataProto"]) -> "DataProto":
        """Join batches along the batch dimension (the collect from data-parallel ranks).

        meta_info: a key with equal values everywhere is kept; ``metrics`` from all parts are merged into one
        list per metric name; any other key with different values raises ValueError.
        """
        if not data:
            raise ValueError("concat: got an empty list of DataProto")
        has_batch = [d.batch is not None for d in data]
        if any(has_batch) and not all(has_batch):
            raise ValueError("concat: some parts have tensors (batch) and some have batch=None")
        batch = torch.cat([d.batch for d in data], dim=0) if all(has_batch) else None
        keys = list(data[0].non_tensor_batch)
        for i, d in enumerate(data):
            if set(d.non_tensor_batch) != set(keys):
                raise ValueError(f"concat: part {i} has non-tensor keys {sorted(d.non_tensor_batch)}, "
                                 f"part 0 has {sorted(keys)}")
        non_tensor = {k: np.concatenate([d.non_tensor_batch[k] for d in data], axis=0) for k in keys}
        meta, metrics = {}, []
        for d in data:
            for key, val in d.meta_info.items():
                if key == "metrics":
                    if val is not None:
                        metrics.append(val)
                elif key in meta and not _deep_equal(meta[key], val):
                    raise ValueError(f"concat: meta_info[{key!r}] differs between parts ({meta[key]!r} vs {val!r})")
                else:
                    meta.setdefault(key, val)
        if metrics:
            meta["metrics"] = _merge_metrics(metrics)
        return type(data[0])(batch=batch, non_tensor_batch=non_tensor, meta_info=meta)

    def repeat(self, repeat_times: int = 2, interleave: bool = True) -> "DataProto":
        """Each row ``repeat_times`` times: ``aabb`` (interleave, the rollout.n order) or ``abab``."""
        n = len(self)
        index = (torch.arange(n).repeat_interleave(repeat_times) if interleave
                 else torch.arange(n).repeat(repeat_times))
        idx_np = index.numpy()
        return self._new(_take_rows(self.batch, index), {k: v[idx_np] for k, v in self.non_tensor_batch.items()})

    def sample_level_repeat(self, repeat_times) -> "DataProto":
        """Row ``i`` repeated ``repeat_times[i]`` times (consecutively)."""
        repeats = torch.as_tensor(np.asarray(repeat_times), dtype=torch.long).reshape(-1)
        if repeats.numel() != len(self):
            raise ValueError(f"sample_level_repeat: got {repeats.numel()} repeat counts for {len(self)} rows")
        return self.select_idxs(torch.arange(len(self)).repeat_interleave(repeats))

    def reorder(self, indices) -> None:
        """Permute rows in place (e.g. after sequence-length balancing)."""
        idx = torch.as_tensor(np.asarray(indices) if not isinstance(indices, torch.Tensor) else indices).long()
        self.batch = _take_rows(self.batch, idx)
        idx_np = idx.cpu().numpy()
        self.non_tensor_batch = {k: v[idx_np] for k, v in self.non_tensor_batch.items()}

    def padding(self, padding_size: int, padding_candidate: str = "first") -> None:
        """Append ``padding_size`` copies of the first (or last) row, in place."""
        if padding_size == 0:
            return
        if padding_candidate not in ("first", "last"):
            raise ValueError(f"padding_candidate must be 'first' or 'last', got {padding_candidate!r}")
        if len(self) == 0:
            raise ValueError("padding: cannot pad an empty DataProto (no row to copy)")
        row = 0 if padding_candidate == "first" else len(self) - 1
        padded = DataProto.concat([self, self.select_idxs([row] * padding_size)])
        self.batch, self.non_tensor_batch = padded.batch, padded.non_tensor_batch

    # ------------------------------------------------------------------------------------ iteration
    def make_iterator(self, mini_batch_size: int, epochs: int, seed: int | None = None,
                      dataloader_kwargs: dict | None = None):
        """Iterator over mini-batches for ``epochs`` epochs (verl semantics: a torch DataLoader over rows).

        ``dataloader_kwargs={"shuffle": True}`` reshuffles every epoch; ``seed`` makes the order reproducible.
        Each mini-batch is gathered with one index operation, not row by row.
        """
        from torch.utils.data import BatchSampler, DataLoader, RandomSampler, SequentialSampler

        if mini_batch_size < 1 or len(self) % mini_batch_size != 0:
            raise ValueError(f"make_iterator: batch size {len(self)} must be a multiple of "
                             f"mini_batch_size={mini_batch_size}")
        kwargs = dict(dataloader_kwargs or {})
        if not isinstance(kwargs, dict):
            raise TypeError(f"dataloader_kwargs must be a dict, got {type(dataloader_kwargs).__name__}")
        shuffle, drop_last = kwargs.pop("shuffle", False), kwargs.pop("drop_last", False)
        generator = torch.Generator().manual_seed(seed) if seed is not None else None
        rows = RandomSampler(range(len(self)), generator=generator) if shuffle else SequentialSampler(range(len(self)))
        loader = DataLoader(self, sampler=BatchSampler(rows, mini_batch_size, drop_last), batch_size=None,
                            collate_fn=_identity, **kwargs)

        def get_data():
            for _ in range(epochs):
                for mini_batch in loader:
                    mini_batch.meta_info = self.meta_info
                    yield mini_batch

        return iter(get_data())

    # ------------------------------------------------------------------------------- serialization
    def __getstate__(self):
        # Tensors go through torch serialization (raw storage bytes, no per-element pickling); views are
        # compacted first so a chunk does not drag its parent's whole storage along.
        batch_state = None
        if self.batch is not None:
            buffer = io.BytesIO()
            torch.save({"tensors": self.batch.apply(_compact).to_dict(),
                        "batch_size": tuple(self.batch.batch_size),
                        "device": None if self.batch.device is None else str(self.batch.device)},
                       buffer, _use_new_zipfile_serialization=False)  # legacy format: no zip pass, ~raw speed
            batch_state = buffer.getvalue()
        return batch_state, self.non_tensor_batch, self.meta_info

    def __setstate__(self, data):
        batch_state, non_tensor_batch, meta_info = data
        batch = None
        if batch_state is not None:
            location = _load_location()
            state = torch.load(io.BytesIO(batch_state), map_location=location, weights_only=False)
            device = state["device"] if location is None or state["device"] is None else location
            batch = TensorDict(state["tensors"], batch_size=state["batch_size"], device=device)
        self.batch, self.non_tensor_batch, self.meta_info = batch, non_tensor_batch, meta_info

    def save_to_disk(self, filepath) -> None:
        """Pickle to ``filepath`` atomically (a reader never sees a half-written file)."""
        directory = os.path.dirname(os.path.abspath(filepath))
        os.makedirs(directory, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".dataproto-", suffix=".tmp", dir=directory)
        try:
            with os.fdopen(fd, "wb") as f:
                pickle.dump(self, f)
            os.replace(tmp, filepath)
        except BaseException:
            if os.path.exists(tmp):
                os.remove(tmp)
            raise

    @staticmethod
    def load_from_disk(filepath) -> "DataProto":
        with open(filepath, "rb") as f:
            return pickle.load(f)


def _identity(x):
    return x


def _load_location():
    """Load on CPU when this process has no accelerator (e.g. a CPU driver receiving a GPU worker's output)."""
    from verl.utils.device import get_device_name

    return "cpu" if get_device_name() == "cpu" else None


# ---------------------------------------------------------------------------------------- padding helpers
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
    padded = DataProto.concat([data, data.select_idxs(np.arange(pad_size) % len(data))])
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


def collate_fn(x: list):
    """Collate a list of samples.

    * dicts (the RL dataset's rows) -> dict: tensors stacked, every other value an object array;
    * DataProtoItems -> DataProto (tensors stacked, non-tensors as object arrays).
    """
    if not x:
        raise ValueError("collate_fn: got an empty list of samples")
    if isinstance(x[0], DataProtoItem):
        batch = torch.stack([item.batch for item in x]) if x[0].batch is not None else None
        non_tensor = list_of_dict_to_dict_of_list([item.non_tensor_batch for item in x])
        return DataProto(batch=batch, non_tensor_batch={k: _to_object_array(v, k) for k, v in non_tensor.items()},
                         meta_info=x[0].meta_info)
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
    import torch.distributed as dist

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


# ------------------------------------------------------------------------------------------ DataProtoFuture
@dataclass
class DataProtoFuture:
    """The not-yet-fetched result of a non-blocking worker-group call.

    ``futures`` are Ray object refs (one per worker); ``.get()`` fetches them, joins them with ``collect_fn``
    and, if this future is one slice of a larger one, picks that slice with ``dispatch_fn``. Passing a future
    to the next worker group lets the data go worker -> worker without the driver waiting in between.
    """

    collect_fn: Callable
    futures: list
    dispatch_fn: Callable | None = None

    @staticmethod
    def concat(data: list) -> "DataProtoFuture":
        """A future that concatenates the DataProtos behind ``data`` (Ray object refs)."""
        return DataProtoFuture(collect_fn=DataProto.concat, futures=list(data))

    def chunk(self, chunks: int) -> list["DataProtoFuture"]:
        """``chunks`` futures, the i-th resolving to chunk i of this future's value."""
        return [DataProtoFuture(collect_fn=self.collect_fn, futures=self.futures,
                                dispatch_fn=_ChunkSelector(i, chunks, self.dispatch_fn)) for i in range(chunks)]

    def get(self):
        """Fetch, collect and (for a chunk) select. A worker that raised or died surfaces as a
        ``WorkerError`` naming its rank, with the Ray error as ``cause``; with several failures, the
        lowest rank among those already finished (healthy ranks still running are not waited for: they
        may be blocked in a collective with the dead one)."""
        import ray

        try:
            outputs = ray.get(self.futures)
        except ray.exceptions.RayError as err:
            raise self._worker_error(err) from err
        for i, out in enumerate(outputs):
            if not isinstance(out, DataProto):
                raise TypeError(f"DataProtoFuture: worker {i} returned {type(out).__name__}, expected DataProto")
        result = self.collect_fn(outputs)
        return self.dispatch_fn(result) if self.dispatch_fn is not None else result

    def _worker_error(self, err: BaseException) -> BaseException:
        """The failure of the first rank, in rank order, among the results already available."""
        import ray

        from verl.single_controller.ray.base import WorkerError  # lazy: protocol stays free of the controller

        ready, _ = ray.wait(self.futures, num_returns=len(self.futures), timeout=0)
        ready = set(ready)
        for rank, ref in enumerate(self.futures):
            if ref not in ready:
                continue
            try:
                ray.get(ref)
            except ray.exceptions.RayError as cause:
                what = "died" if isinstance(cause, ray.exceptions.ActorDiedError) else "raised"
                msg = (f"DataProtoFuture: rank {rank} of {len(self.futures)} {what} while computing its result. "
                       f"Worker traceback / Ray error:\n{type(cause).__name__}: {cause}")
                return WorkerError(msg, rank=rank, cause=cause)
        return err


@dataclass
class _ChunkSelector:
    """Picklable ``dispatch_fn``: apply the parent's dispatch (if any), then take chunk ``index``."""

    index: int
    chunks: int
    parent: Callable | None = None

    def __call__(self, data: DataProto) -> DataProto:
        if self.parent is not None:
            data = self.parent(data)
        return data.chunk(chunks=self.chunks)[self.index]
