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
import pickle
from dataclasses import dataclass, field

import numpy as np
import torch
from tensordict import NonTensorStack, TensorDict
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, SequentialSampler

# The helpers live in verl/_protocol/, one module per responsibility; they are re-exported here (private
# names included: tests and older callers import them from verl.protocol). DataProto itself stays here so
# pickles keep naming it verl.protocol.DataProto.
from verl._protocol.collate import all_gather_data_proto, collate_items, collate_rows
from verl._protocol.config import DataProtoConfig, _DataProtoConfigMeta  # noqa: F401
from verl._protocol.containers import (  # noqa: F401
    _deep_equal,
    _merge_metrics,
    _to_object_array,
    list_of_dict_to_dict_of_list,
    union_numpy_dict,
    union_tensor_dict,
    union_two_dict,
)
from verl._protocol.future import DataProtoFuture, WorkerError, _ChunkSelector  # noqa: F401
from verl._protocol.padding import fold_batch_dim, pad_dataproto_to_divisor, unfold_batch_dim, unpad_dataproto
from verl._protocol.serialization import _compact, _load_location  # noqa: F401
from verl._protocol.serialization import (
    batch_from_bytes,
    batch_from_state,
    batch_to_bytes,
    batch_to_state,
    deserialize_single_tensor,
    deserialize_tensordict,
    pickle_atomically,
    serialize_single_tensor,
    serialize_tensordict,
)
from verl.utils import tensordict_utils as tu

__all__ = [
    "DataProto",
    "DataProtoConfig",
    "DataProtoFuture",
    "DataProtoItem",
    "all_gather_data_proto",
    "collate_fn",
    "deserialize_single_tensor",
    "deserialize_tensordict",
    "fold_batch_dim",
    "list_of_dict_to_dict_of_list",
    "pad_dataproto_to_divisor",
    "serialize_single_tensor",
    "serialize_tensordict",
    "union_numpy_dict",
    "union_tensor_dict",
    "union_two_dict",
    "unfold_batch_dim",
    "unpad_dataproto",
]


# ---------------------------------------------------------------------------------------------- row helpers
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
        """One TensorDict: the tensors, each non-tensor column as a per-row ``NonTensorStack`` and each
        meta_info entry as batch-level ``NonTensorData`` (see :mod:`verl.utils.tensordict_utils`)."""
        tensors: dict = dict(self.batch.items()) if self.batch is not None else {}
        clash = sorted(set(tensors) & set(self.non_tensor_batch))
        if clash:
            raise ValueError(f"to_tensordict: keys {clash} are in both batch and non_tensor_batch")
        tensors.update({k: list(v) for k, v in self.non_tensor_batch.items()})
        td = tu.get_tensordict(tensors, non_tensor_dict=dict(self.meta_info))
        if not tensors:  # no per-row entry fixes the batch size: keep this DataProto's length
            td.batch_size = [len(self)]
        return td

    @classmethod
    def from_tensordict(cls, tensor_dict: TensorDict | None = None, meta_info: dict | None = None,
                        num_batch_dims: int = 1) -> "DataProto":
        """Undo :meth:`to_tensordict`: tensors -> ``batch``, per-row stacks -> ``non_tensor_batch`` (object
        arrays), batch-level values -> ``meta_info`` (merged over ``meta_info``)."""
        if tensor_dict is None:
            raise ValueError("from_tensordict needs a TensorDict")
        if num_batch_dims < 1:
            raise ValueError(f"num_batch_dims must be >= 1, got {num_batch_dims}")
        batch_size = tuple(tensor_dict.batch_size[:num_batch_dims])
        tensors, non_tensors, meta = {}, {}, dict(meta_info or {})
        for key in tensor_dict.keys():
            value = tensor_dict.get(key)
            if isinstance(value, torch.Tensor):
                tensors[key] = value
            elif isinstance(value, NonTensorStack):
                non_tensors[key] = _to_object_array(value.tolist(), key)
            else:
                meta[key] = tu.unwrap_non_tensor_data(value)
        batch = TensorDict(tensors, batch_size=batch_size, device=tensor_dict.device) if tensors else None
        return cls(batch=batch, non_tensor_batch=non_tensors, meta_info=meta)

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

    def padding(self, padding_size: int, padding_candidate: str = "") -> None:
        """Append ``padding_size`` copies of one row, in place: the first row for ``"first"``, the last row
        otherwise (``"last"`` or verl's default ``""``)."""
        if padding_size == 0:
            return
        if padding_candidate not in ("", "first", "last"):
            raise ValueError(f"padding_candidate must be 'first' or 'last' (or '' for the last row), "
                             f"got {padding_candidate!r}")
        if len(self) == 0:
            raise ValueError("padding: cannot pad an empty DataProto (no row to copy)")
        row = 0 if padding_candidate == "first" else len(self) - 1
        padded = DataProto.concat([self, self.select_idxs([row] * padding_size)])
        self.batch, self.non_tensor_batch = padded.batch, padded.non_tensor_batch

    def unfold_column_chunks(self, n_split: int, split_keys: list[str] | None = None) -> "DataProto":
        """Move ``n_split`` chunks of the second dim into the batch dim: ``(B, n_split * k, ...)`` becomes
        ``(B * n_split, k, ...)`` for the keys in ``split_keys`` (every key when None); the other keys repeat
        each row ``n_split`` times so rows stay aligned. Used for grouped samples that must not be shuffled
        apart before this point."""
        keys = set(split_keys) if split_keys is not None else None

        def unfold(name, value, repeat):
            if keys is not None and name not in keys:
                return repeat(value)
            if value.ndim < 2 or value.shape[1] % n_split != 0:
                raise ValueError(f"unfold_column_chunks: {name!r} has shape {tuple(value.shape)}; its second dim "
                                 f"must be divisible by n_split={n_split}")
            return value.reshape(value.shape[0] * n_split, value.shape[1] // n_split, *value.shape[2:])

        batch = None
        if self.batch is not None:
            tensors = {k: unfold(k, v, lambda t: torch.repeat_interleave(t, n_split, dim=0))
                       for k, v in self.batch.items()}
            batch = TensorDict(tensors, batch_size=(self.batch.batch_size[0] * n_split,), device=self.batch.device)
        non_tensor = {k: unfold(k, v, lambda a: np.repeat(a, n_split, axis=0)) for k, v in self.non_tensor_batch.items()}
        return type(self)(batch=batch, non_tensor_batch=non_tensor, meta_info=self.meta_info)

    # ------------------------------------------------------------------------------------ iteration
    def make_iterator(self, mini_batch_size: int, epochs: int, seed: int | None = None,
                      dataloader_kwargs: dict | None = None):
        """Iterator over mini-batches for ``epochs`` epochs (verl semantics: a torch DataLoader over rows).

        ``dataloader_kwargs={"shuffle": True}`` reshuffles every epoch; ``seed`` makes the order reproducible.
        Each mini-batch is gathered with one index operation, not row by row.
        """
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
    # The byte format lives in verl._protocol.serialization; these methods are the pickle / disk entry points.
    def __getstate__(self):
        return batch_to_state(self.batch), self.non_tensor_batch, self.meta_info

    def __setstate__(self, data):
        batch_state, non_tensor_batch, meta_info = data
        self.batch, self.non_tensor_batch, self.meta_info = batch_from_state(batch_state), non_tensor_batch, meta_info

    def save_to_disk(self, filepath) -> None:
        """Pickle to ``filepath`` atomically (a reader never sees a half-written file)."""
        pickle_atomically(self, filepath)

    @staticmethod
    def load_from_disk(filepath) -> "DataProto":
        with open(filepath, "rb") as f:
            return pickle.load(f)


def _identity(x):
    return x


def collate_fn(x: list):
    """Collate a list of samples: DataProtoItems -> one DataProto (tensors stacked, non-tensors as object
    arrays); dataset rows (dicts) -> one dict (tensors stacked, other values as object arrays)."""
    if not x:
        raise ValueError("collate_fn: got an empty list of samples")
    if isinstance(x[0], DataProtoItem):
        batch, non_tensor, meta_info = collate_items(x)
        return DataProto(batch=batch, non_tensor_batch=non_tensor, meta_info=meta_info)
    return collate_rows(x)
