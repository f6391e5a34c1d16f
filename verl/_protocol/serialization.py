"""How a DataProto is pickled and written to disk (used by ``DataProto.__getstate__`` and friends).

Dense CPU tensors travel as numpy arrays (:func:`batch_to_state`): pickle protocol 5 ships their bytes as they are,
and Ray's serializer passes them out of band, with no torch serialization pass (~0.07 ms instead of ~0.45 ms
each way for a 128-row batch of eleven fields). A view ships only its own elements. Dtypes numpy lacks (bf16,
float8) travel as raw bytes plus (dtype, shape). A batch with tensors on an accelerator keeps torch
serialization (:func:`batch_to_bytes`, which keeps their devices), as do pickles written before this format; a
batch holding anything else (nested tensors, non-tensor entries) goes through :func:`serialize_tensordict`.
:func:`batch_from_state` reads all three. Non-tensors and meta_info are pickled as is.
"""

from __future__ import annotations

import io
import os
import pickle
import tempfile

from typing import Any

import numpy as np
import torch
from tensordict import NonTensorData, NonTensorStack, TensorDict

from verl.utils.device import get_device_name


def _compact(t: torch.Tensor) -> torch.Tensor:
    """A tensor that owns exactly its bytes: pickling a view would otherwise ship its whole base storage."""
    if t.is_contiguous() and t.storage_offset() == 0 and t.untyped_storage().nbytes() == t.numel() * t.element_size():
        return t
    return t.clone(memory_format=torch.contiguous_format)


def _load_location():
    """Load on CPU when this process has no accelerator (e.g. a CPU driver receiving a GPU worker's output)."""
    return "cpu" if get_device_name() == "cpu" else None


# dtypes torch's legacy (non-zip) format cannot write; they travel as raw bytes plus (dtype, shape)
_RAW_DTYPES = tuple(getattr(torch, name) for name in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz",
                                                      "float8_e5m2fnuz", "uint16", "uint32", "uint64")
                    if hasattr(torch, name))


def batch_to_bytes(batch: TensorDict | None) -> bytes | None:
    """The tensors of ``batch`` (with batch size and device) as bytes; ``None`` for no batch."""
    if batch is None:
        return None
    compact = batch.apply(_compact)
    raw = {key: t for key, t in compact.items(True, True) if t.dtype in _RAW_DTYPES}
    if raw:
        compact = compact.exclude(*raw)
    buffer = io.BytesIO()
    torch.save({"tensors": compact.to_dict(),
                "raw": {key: (t.reshape(-1).view(torch.uint8), str(t.dtype).removeprefix("torch."), tuple(t.shape))
                        for key, t in raw.items()},
                "batch_size": tuple(batch.batch_size),
                "device": None if batch.device is None else str(batch.device)},
               buffer, _use_new_zipfile_serialization=False)  # legacy format: no zip pass, ~raw speed
    return buffer.getvalue()


def _array(t: torch.Tensor):
    """A dense CPU tensor as a numpy array over its elements, or ``(dtype, shape, uint8 array)`` for dtypes numpy
    lacks."""
    t = t.detach()
    try:
        return t.resolve_conj().resolve_neg().numpy()
    except TypeError:  # bf16, float8, ...: no numpy dtype
        raw = t.contiguous().reshape(-1).view(torch.uint8).numpy()
        return str(t.dtype).removeprefix("torch."), tuple(t.shape), raw


def _tensor(value) -> torch.Tensor:
    """Undo :func:`_array`. Arrays Ray hands over out of band are read-only views of its object store: those
    are copied, so the tensor can be written in place."""
    if isinstance(value, tuple):
        dtype, shape, data = value
        data = data if data.flags.writeable else data.copy()
        return torch.from_numpy(data).view(getattr(torch, dtype)).reshape(shape)
    return torch.from_numpy(value if value.flags.writeable else value.copy())


def batch_to_state(batch: TensorDict | None):
    """The picklable state of ``batch``: ``{"arrays", "batch_size", "device"}`` when every leaf is a dense CPU
    tensor; :func:`batch_to_bytes` (torch serialization, which keeps each tensor's device) when a leaf is on an
    accelerator; else ``{"tensordict": serialize_tensordict(batch)}``. ``None`` for no batch."""
    if batch is None:
        return None
    arrays = {}
    for key, value in batch.items(True, True):
        if isinstance(value, torch.Tensor) and value.device.type != "cpu":
            return batch_to_bytes(batch)
        if not isinstance(value, torch.Tensor) or value.is_nested or value.layout != torch.strided:
            return {"tensordict": serialize_tensordict(batch)}
        arrays[key] = _array(value)
    return {"arrays": arrays, "batch_size": tuple(batch.batch_size),
            "device": None if batch.device is None else str(batch.device)}


def batch_from_state(state) -> TensorDict | None:
    """Undo :func:`batch_to_state` (or :func:`batch_to_bytes`); tensors land on CPU if this process has no
    accelerator."""
    if state is None or isinstance(state, bytes):
        return batch_from_bytes(state)
    if "tensordict" in state:
        return deserialize_tensordict(state["tensordict"])
    location = _load_location()
    device = state["device"] if location is None or state["device"] is None else location
    td = TensorDict({}, batch_size=state["batch_size"], device=device)
    for key, value in state["arrays"].items():
        td.set(key, _tensor(value))
    return td


def batch_from_bytes(batch_state: bytes | None) -> TensorDict | None:
    """Undo :func:`batch_to_bytes`; tensors land on CPU if this process has no accelerator."""
    if batch_state is None:
        return None
    location = _load_location()
    state = torch.load(io.BytesIO(batch_state), map_location=location, weights_only=False)
    device = state["device"] if location is None or state["device"] is None else location
    td = TensorDict(state["tensors"], batch_size=state["batch_size"], device=device)
    for key, (data, dtype, shape) in state.get("raw", {}).items():
        td.set(key, data.view(getattr(torch, dtype)).reshape(shape))
    return td


def pickle_atomically(obj, filepath) -> None:
    """Pickle ``obj`` to ``filepath`` via a temporary file and a rename (a reader never sees a half-written file)."""
    directory = os.path.dirname(os.path.abspath(filepath))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".dataproto-", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            pickle.dump(obj, f)
        os.replace(tmp, filepath)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


# ------------------------------------------------------------------------------------------------------------
# verl's tensor <-> (dtype, shape, bytes) helpers: a picklable form made of strings, tuples and numpy byte arrays
# (no torch storages), bit-exact for every dtype (bf16 and float8 included), empty and nested tensors too.
# ------------------------------------------------------------------------------------------------------------
_NON_TENSOR = "__non_tensor__"  # tag of a 4-tuple entry holding a NonTensorData / NonTensorStack value


def serialize_single_tensor(obj: torch.Tensor) -> tuple[str, tuple[int, ...], np.ndarray]:
    """``(dtype name, shape, raw bytes as a uint8 numpy array)`` of a dense CPU-readable tensor."""
    if obj.is_nested:
        raise ValueError("serialize_single_tensor takes a dense tensor; use serialize_tensordict for nested ones")
    flat = obj.detach().cpu().contiguous().reshape(-1)
    data = flat.view(torch.uint8).numpy().copy() if flat.numel() else np.empty(0, dtype=np.uint8)
    return str(obj.dtype).removeprefix("torch."), tuple(obj.shape), data


def deserialize_single_tensor(arr: tuple) -> torch.Tensor:
    """Undo :func:`serialize_single_tensor` (a new tensor that owns its memory)."""
    dtype_name, shape, data = arr
    dtype = getattr(torch, dtype_name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown torch dtype {dtype_name!r} in serialized tensor")
    raw = np.ascontiguousarray(data, dtype=np.uint8)
    if raw.size == 0:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(bytearray(raw.tobytes()), dtype=torch.uint8).view(dtype).reshape(shape)


def serialize_tensordict(batch: TensorDict) -> tuple[tuple[int, ...], str | None, dict[str, Any]]:
    """``(batch_size, device, {key: encoded})`` for a TensorDict.

    A dense tensor is encoded by :func:`serialize_single_tensor` (a 3-tuple), a nested tensor as
    ``(layout, [one 3-tuple per row])``; per-row objects (NonTensorStack) and batch-level values
    (NonTensorData) are kept as Python values in a 4-tuple, so a TensorDict built with
    ``verl.utils.tensordict_utils.get_tensordict`` round-trips as a whole.
    """
    encoded: dict[str, Any] = {}
    for key, value in batch.items():
        if isinstance(value, NonTensorStack):
            encoded[key] = (_NON_TENSOR, "stack", value.tolist(), tuple(value.batch_size))
        elif isinstance(value, NonTensorData):
            encoded[key] = (_NON_TENSOR, "data", value.data, tuple(value.batch_size))
        elif value.is_nested:
            layout = str(value.layout).removeprefix("torch.")
            encoded[key] = (layout, [serialize_single_tensor(row) for row in value.unbind()])
        else:
            encoded[key] = serialize_single_tensor(value)
    device = str(batch.device) if batch.device is not None else None
    return tuple(batch.batch_size), device, encoded


def deserialize_tensordict(arr: tuple) -> TensorDict:
    """Undo :func:`serialize_tensordict`."""
    batch_size, device, encoded = arr
    items: dict[str, Any] = {}
    non_tensors: dict[str, Any] = {}
    for key, value in encoded.items():
        if len(value) == 4 and value[0] == _NON_TENSOR:
            non_tensors[key] = value
        elif len(value) == 3:
            items[key] = deserialize_single_tensor(value)
        elif len(value) == 2:
            layout, rows = value
            items[key] = torch.nested.as_nested_tensor([deserialize_single_tensor(r) for r in rows],
                                                       layout=getattr(torch, layout))
        else:
            raise ValueError(f"serialized entry {key!r} has {len(value)} fields; expected 2, 3 or 4")
    td = TensorDict(source=items, batch_size=batch_size, device=device)
    for key, (_, kind, value, _size) in non_tensors.items():
        td[key] = NonTensorStack.from_list([NonTensorData(v) for v in value]) if kind == "stack" else NonTensorData(value)
    return td
