"""How a DataProto is pickled and written to disk (used by ``DataProto.__getstate__`` and friends).

Tensors go through torch serialization (raw storage bytes, no per-element pickling); views are compacted
first so a chunk does not drag its parent's whole storage along. Non-tensors and meta_info are pickled as is.
"""

from __future__ import annotations

import io
import os
import pickle
import tempfile

import torch
from tensordict import TensorDict


def _compact(t: torch.Tensor) -> torch.Tensor:
    """A tensor that owns exactly its bytes: pickling a view would otherwise ship its whole base storage."""
    if t.is_contiguous() and t.storage_offset() == 0 and t.untyped_storage().nbytes() == t.numel() * t.element_size():
        return t
    return t.clone(memory_format=torch.contiguous_format)


def _load_location():
    """Load on CPU when this process has no accelerator (e.g. a CPU driver receiving a GPU worker's output)."""
    from verl.utils.device import get_device_name

    return "cpu" if get_device_name() == "cpu" else None


def batch_to_bytes(batch: TensorDict | None) -> bytes | None:
    """The tensors of ``batch`` (with batch size and device) as bytes; ``None`` for no batch."""
    if batch is None:
        return None
    buffer = io.BytesIO()
    torch.save({"tensors": batch.apply(_compact).to_dict(),
                "batch_size": tuple(batch.batch_size),
                "device": None if batch.device is None else str(batch.device)},
               buffer, _use_new_zipfile_serialization=False)  # legacy format: no zip pass, ~raw speed
    return buffer.getvalue()


def batch_from_bytes(batch_state: bytes | None) -> TensorDict | None:
    """Undo :func:`batch_to_bytes`; tensors land on CPU if this process has no accelerator."""
    if batch_state is None:
        return None
    location = _load_location()
    state = torch.load(io.BytesIO(batch_state), map_location=location, weights_only=False)
    device = state["device"] if location is None or state["device"] is None else location
    return TensorDict(state["tensors"], batch_size=state["batch_size"], device=device)


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
