"""Helpers for batches kept as one ``tensordict.TensorDict`` (verl's TensorDict-based data path).

A DataProto keeps tensors, per-sample Python objects and batch-level settings in three containers. The
TensorDict form keeps all three in one: tensors (including jagged nested tensors for variable-length rows),
per-sample objects as a ``NonTensorStack`` (one entry per row: lists, dicts, strings ...) and batch-level
settings as ``NonTensorData``. These functions build, read, index, pad, concatenate and iterate such batches
so that callers never have to remember which wrapper a value sits in: :func:`get` and :func:`pop` hand back
plain tensors, lists and Python values.
"""

from __future__ import annotations

import logging
from typing import Any, Iterable, Iterator

import torch
from tensordict import NonTensorData, NonTensorStack, TensorDict
from torch.utils.data import DataLoader

__all__ = [
    "assign_non_tensor",
    "assign_non_tensor_data",
    "assign_non_tensor_stack",
    "assert_tensordict_eq",
    "chunk_tensordict",
    "concat_nested_tensors",
    "concat_tensordict",
    "get",
    "get_keys",
    "get_non_tensor_data",
    "get_tensordict",
    "index_select_tensor_dict",
    "make_iterator",
    "pad_to_divisor",
    "pop",
    "pop_keys",
    "union_tensor_dict",
    "unpad",
    "unwrap_non_tensor_data",
]

logger = logging.getLogger(__name__)


def _require_tensordict(value: Any, what: str = "tensor_dict") -> None:
    if not isinstance(value, TensorDict):
        raise TypeError(f"{what} must be a tensordict.TensorDict, got {type(value).__name__}")


def _is_nested(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.is_nested


def _stack(items: list) -> NonTensorStack:
    """One NonTensorData per element, so nested lists/dicts stay one entry per row."""
    return NonTensorStack.from_list([NonTensorData(item) for item in items])


# ------------------------------------------------------------------------------------------ writing
def assign_non_tensor_data(tensor_dict: TensorDict, key, val) -> None:
    """Store ``val`` as one batch-level value (``NonTensorData``) under ``key``."""
    _require_tensordict(tensor_dict)
    tensor_dict[key] = NonTensorData(val)


def assign_non_tensor_stack(tensor_dict: TensorDict, key, val: list) -> None:
    """Store a list with one (possibly nested) Python object per row as a ``NonTensorStack``.

    ``[[], [0.5, 0.8], [0.9]]`` or ``[{"acc": 1.0}, {"acc": 0.0}]`` keep their structure row by row.
    """
    _require_tensordict(tensor_dict)
    tensor_dict[key] = _stack(list(val))


def assign_non_tensor(tensor_dict: TensorDict, **kwargs) -> TensorDict:
    """Store each keyword: lists become per-row stacks, other values batch-level data. Returns ``tensor_dict``."""
    _require_tensordict(tensor_dict)
    for key, val in kwargs.items():
        if isinstance(val, (NonTensorData, NonTensorStack)):
            tensor_dict[key] = val
        elif isinstance(val, list):
            assign_non_tensor_stack(tensor_dict, key, val)
        else:
            assign_non_tensor_data(tensor_dict, key, val)
    return tensor_dict


def get_tensordict(tensor_dict: dict[str, torch.Tensor | list], non_tensor_dict: dict | None = None) -> TensorDict:
    """Build a TensorDict from ``{name: tensor or per-row list}`` plus batch-level ``non_tensor_dict``.

    Every tensor / list must have the same length (the batch size); lists become ``NonTensorStack`` (keep
    tensors out of them: convert to numpy first). Nested tensors must be contiguous (``layout=torch.jagged``).
    With no per-row entries the batch size is ``[]``.
    """
    source = dict(tensor_dict)
    non_tensor_dict = {} if non_tensor_dict is None else non_tensor_dict
    batch_size = None
    first_key = None
    for key, val in list(source.items()):
        if _is_nested(val) and not val.is_contiguous():
            raise ValueError(f"nested tensor {key!r} must be contiguous; build it with layout=torch.jagged")
        if isinstance(val, NonTensorStack):
            length = len(val)
        elif isinstance(val, list):
            if any(isinstance(v, torch.Tensor) for v in val):
                raise TypeError(f"list {key!r} holds torch.Tensors; a list becomes a NonTensorStack, which does "
                                f"not take tensors. Convert them to numpy first, or pass one stacked tensor")
            source[key] = _stack(val)
            length = len(val)
        elif isinstance(val, torch.Tensor):
            length = val.size(0)
        else:
            raise TypeError(f"tensor_dict[{key!r}] must be a torch.Tensor or a list, got {type(val).__name__}; "
                            f"put batch-level values in non_tensor_dict")
        if batch_size is None:
            batch_size, first_key = length, key
        elif length != batch_size:
            raise ValueError(f"Batch size of {key!r} is {length} but {first_key!r} has {batch_size}; every entry "
                             f"needs one row per sample")
    for key, val in non_tensor_dict.items():
        if key in source:
            raise ValueError(f"key {key!r} is in both tensor_dict and non_tensor_dict")
        source[key] = NonTensorData(val)
    return TensorDict(source=source, batch_size=[] if batch_size is None else [batch_size])


# ------------------------------------------------------------------------------------------ reading
def unwrap_non_tensor_data(data):
    """The Python value inside a ``NonTensorData``; anything else is returned as is."""
    return data.data if isinstance(data, NonTensorData) else data


def get_non_tensor_data(data: TensorDict, key: str, default):
    """``data[key]`` unwrapped from ``NonTensorData``, or ``default`` when the key is missing."""
    return unwrap_non_tensor_data(data.get(key, default))


def _plain(value):
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, NonTensorStack):
        return value.tolist()
    if isinstance(value, NonTensorData):
        return value.data
    raise TypeError(f"unexpected TensorDict entry of type {type(value).__name__}")


def get(tensordict: TensorDict, key: str, default=None) -> Any:
    """A tensor, a list (for per-row objects) or the Python value (batch-level); ``default`` if missing."""
    if key not in tensordict.keys():
        return default
    return _plain(tensordict.get(key))


def pop(tensordict: TensorDict, key: str, default=None) -> Any:
    """Like :func:`get`, removing the key."""
    if key not in tensordict.keys():
        return default
    return _plain(tensordict.pop(key))


def _take_keys(tensordict: TensorDict, keys: Iterable[str], remove: bool) -> TensorDict:
    tensors, non_tensors = {}, {}
    for key in keys:
        if key not in tensordict.keys():
            raise KeyError(f"key {key} not in tensordict (keys: {sorted(tensordict.keys())})")
        value = tensordict.pop(key) if remove else tensordict.get(key)
        if isinstance(value, NonTensorData):
            non_tensors[key] = value.data
        else:
            tensors[key] = _plain(value)
    return get_tensordict(tensors, non_tensors)


def get_keys(tensordict: TensorDict, keys: Iterable[str]) -> TensorDict:
    """A new TensorDict with only ``keys`` (KeyError naming a missing key)."""
    return _take_keys(tensordict, keys, remove=False)


def pop_keys(tensordict: TensorDict, keys: Iterable[str]) -> TensorDict:
    """Like :func:`get_keys`, removing the keys from ``tensordict``."""
    return _take_keys(tensordict, keys, remove=True)


# --------------------------------------------------------------------------------- rows and batches
def concat_nested_tensors(tensors: list[torch.Tensor]) -> torch.Tensor:
    """Concatenate 2-D jagged nested tensors along the batch dimension."""
    rows = []
    for i, t in enumerate(tensors):
        if not (_is_nested(t) and t.is_contiguous()):
            raise ValueError(f"tensors[{i}] must be a contiguous nested tensor (layout=torch.jagged)")
        if t.dim() != 2:
            raise ValueError(f"tensors[{i}] has {t.dim()} dims; concat_nested_tensors takes (batch, jagged) tensors")
        rows.extend(t.unbind(0))
    return torch.nested.as_nested_tensor(rows, layout=torch.jagged)


def concat_tensordict(data: list[TensorDict]) -> TensorDict:
    """Concatenate TensorDicts on dim 0; nested tensors are concatenated row-wise."""
    if not data:
        raise ValueError("concat_tensordict needs at least one TensorDict")
    nested_keys = {k for k, v in data[0].items() if _is_nested(v)}
    if not nested_keys:
        return torch.cat(list(data), dim=0)
    regular = []
    for i, td in enumerate(data):
        keys = {k for k, v in td.items() if _is_nested(v)}
        if keys != nested_keys:
            raise ValueError(f"TensorDict {i} has nested tensors {sorted(keys)}, the first has {sorted(nested_keys)}")
        regular.append(TensorDict({k: v for k, v in td.items() if k not in nested_keys},
                                  batch_size=td.batch_size, device=td.device))
    output = torch.cat(regular, dim=0)
    for key in nested_keys:
        output[key] = concat_nested_tensors([td[key] for td in data])
    return output


def index_select_tensor_dict(batch: TensorDict | None, indices: torch.Tensor | list[int]) -> TensorDict | None:
    """Rows ``indices`` of ``batch`` (nested tensors and per-row objects included; batch-level data kept)."""
    if batch is None:
        return None
    if isinstance(indices, list):
        indices = torch.tensor(indices, dtype=torch.long)
    if indices.dim() != 1:
        raise ValueError(f"indices must be a 1-D tensor, got shape {tuple(indices.shape)}")
    out = {}
    for key, value in batch.items():
        if _is_nested(value):
            out[key] = torch.nested.as_nested_tensor([value[int(i)] for i in indices], layout=torch.jagged)
        elif isinstance(value, torch.Tensor):
            out[key] = value[indices]
        elif isinstance(value, NonTensorData) and not value.batch_size:
            out[key] = value
        else:
            out[key] = value[indices]
    return TensorDict(source=out, batch_size=[indices.shape[0]])


def chunk_tensordict(td: TensorDict, chunks: int) -> list[TensorDict]:
    """``chunks`` consecutive parts of equal length (the dispatch to data-parallel ranks); jagged tensors,
    per-row objects and batch-level values are carried into every part. The length must divide evenly."""
    _require_tensordict(td, "td")
    n = td.batch_size[0] if td.batch_size else 0
    if chunks < 1 or n % chunks != 0:
        raise ValueError(f"cannot split a TensorDict of {n} rows into {chunks} equal chunks; pad it first "
                         f"(pad_to_divisor) or make the batch size a multiple of {chunks}")
    size = n // chunks
    return [index_select_tensor_dict(td, torch.arange(i * size, (i + 1) * size)) for i in range(chunks)]


def union_tensor_dict(tensor_dict1: TensorDict, tensor_dict2: TensorDict) -> TensorDict:
    """Add the entries of ``tensor_dict2`` to ``tensor_dict1``; shared keys must hold equal values."""
    if tensor_dict1.batch_size != tensor_dict2.batch_size:
        raise ValueError(f"Two tensor dict must have identical batch size. Got {tensor_dict1.batch_size} and "
                         f"{tensor_dict2.batch_size}")
    for key in tensor_dict2.keys():
        value = tensor_dict2.get(key)
        if key not in tensor_dict1.keys():
            tensor_dict1[key] = value
            continue
        mine = tensor_dict1.get(key)
        same = mine.equal(value) if isinstance(value, torch.Tensor) else _plain(mine) == _plain(value)
        if not same:
            raise ValueError(f"{key!r} is in both tensor dicts with different values; pop or rename one first")
    return tensor_dict1


def make_iterator(tensordict: TensorDict, mini_batch_size: int, epochs: int, seed: int | None = None,
                  dataloader_kwargs: dict | None = None) -> Iterator[TensorDict]:
    """Mini-batches of ``mini_batch_size`` rows for ``epochs`` passes (shuffled with ``seed`` if asked)."""
    if tensordict.batch_size[0] % mini_batch_size != 0:
        raise ValueError(f"batch size {tensordict.batch_size[0]} is not divisible by mini_batch_size {mini_batch_size}")
    dataloader_kwargs = {} if dataloader_kwargs is None else dataloader_kwargs
    if not isinstance(dataloader_kwargs, dict):
        raise TypeError(f"dataloader_kwargs must be a dict, got {type(dataloader_kwargs).__name__}")
    generator = None
    if seed is not None:
        generator = torch.Generator()
        generator.manual_seed(seed)
    loader = DataLoader(dataset=tensordict, batch_size=mini_batch_size, collate_fn=_identity, generator=generator,
                        **dataloader_kwargs)

    def batches():
        for _ in range(epochs):
            yield from loader

    return iter(batches())


def _identity(batch):
    return batch


def pad_to_divisor(data: TensorDict, size_divisor: int) -> tuple[TensorDict, int]:
    """Repeat rows from the start until the length divides ``size_divisor``; returns ``(padded, pad_size)``."""
    _require_tensordict(data, "data")
    if len(data) % size_divisor == 0:
        if len(data) == 0:
            logger.warning("padding a TensorDict with no rows: nothing changed")
        return data, 0
    pad_size = size_divisor - len(data) % size_divisor
    parts, remaining = [data], pad_size
    while remaining > 0:
        take = min(remaining, len(data))
        parts.append(data[:take])
        remaining -= take
    return torch.cat(parts), pad_size


def unpad(data: TensorDict, pad_size: int) -> TensorDict:
    """Drop the last ``pad_size`` rows (undo :func:`pad_to_divisor`)."""
    return data[:-pad_size] if pad_size != 0 else data


def assert_tensordict_eq(tensordict1: TensorDict, tensordict2: TensorDict) -> None:
    """AssertionError unless both hold the same keys with equal values (nested tensors compared row by row)."""
    keys1, keys2 = set(tensordict1.keys()), set(tensordict2.keys())
    assert keys1 == keys2, f"key sets differ: {sorted(keys1 ^ keys2)}"
    for key in keys1:
        a, b = tensordict1.get(key), tensordict2.get(key)
        assert type(a) is type(b), f"{key!r}: {type(a).__name__} vs {type(b).__name__}"
        if _is_nested(a):
            rows_a, rows_b = a.unbind(), b.unbind()
            assert len(rows_a) == len(rows_b), f"{key!r}: {len(rows_a)} vs {len(rows_b)} rows"
            for i, (x, y) in enumerate(zip(rows_a, rows_b)):
                assert torch.equal(x, y), f"{key!r}: row {i} differs"
        elif isinstance(a, torch.Tensor):
            assert a.shape == b.shape and torch.equal(a, b), f"{key!r}: tensors differ"
        else:
            assert _plain(a) == _plain(b), f"{key!r}: values differ"
