"""Reading the per-rank files of an FSDP checkpoint folder, whatever wrote them, and resharding them.

Two layouts are read:

- verl's (what :class:`FSDPCheckpointManager` writes now): ``model_world_size_{W}_rank_{r}.pt`` is
  ``model.state_dict()`` of an FSDP2 model (DTensors), ``optim_world_size_{W}_rank_{r}.pt`` is
  ``optimizer.state_dict()`` (DTensor moments), ``extra_state_world_size_{W}_rank_{r}.pt`` holds
  ``{"lr_scheduler", "rng"}``, ``fsdp_config.json`` is ``{"FSDP_version": 2, "world_size": W}``.
- the older wrapped layout of this package: ``{"format": "verl-fsdp2-local-shards-v1", "state_dict": local tensors,
  "dtensor": {key: {"shape", "placements", "mesh_shape", "coordinate"}}}``.

Every saved sharded entry becomes a :class:`SavedShard` (local piece, placements, mesh coordinate, global
shape); :func:`full_tensor` puts the W pieces of one entry back together, so a checkpoint can be loaded by any
number of ranks (each takes its piece of the full tensor) and merged without a process group.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass

import torch
from torch.distributed.tensor import DTensor, Placement, Replicate, Shard

WRAPPED_FORMAT = "verl-fsdp2-local-shards-v1"
_FILE_RE = re.compile(r"^(model|optim|extra_state)_world_size_(\d+)_rank_(\d+)\.pt$")

__all__ = ["SavedShard", "WRAPPED_FORMAT", "CheckpointFormatError", "model_file", "optim_file", "extra_file",
           "saved_world_size", "own_storage", "read_model_file", "read_optim_file", "full_tensor", "load_full_model_state"]


class CheckpointFormatError(ValueError):
    """A checkpoint file or folder this package cannot read; the message says what was found and expected."""


def model_file(world_size: int, rank: int) -> str:
    return f"model_world_size_{world_size}_rank_{rank}.pt"


def optim_file(world_size: int, rank: int) -> str:
    return f"optim_world_size_{world_size}_rank_{rank}.pt"


def extra_file(world_size: int, rank: int) -> str:
    return f"extra_state_world_size_{world_size}_rank_{rank}.pt"


@dataclass
class SavedShard:
    """One rank's piece of a sharded tensor, with what is needed to rebuild the full tensor."""

    local: torch.Tensor
    placements: tuple[Placement, ...]
    coordinate: tuple[int, ...]
    shape: tuple[int, ...]


def _describe(path: str) -> str:
    names = sorted(os.listdir(path)) if os.path.isdir(path) else []
    return ", ".join(names[:12]) + (" ..." if len(names) > 12 else "") if names else "nothing"


def saved_world_size(local_dir: str, kind: str = "model") -> int:
    """W of the ``{kind}_world_size_W_rank_*.pt`` files (checked against ``fsdp_config.json`` when present)."""
    sizes = {}
    for name in os.listdir(local_dir):
        m = _FILE_RE.match(name)
        if m and m.group(1) == kind:
            sizes.setdefault(int(m.group(2)), set()).add(int(m.group(3)))
    cfg_path = os.path.join(local_dir, "fsdp_config.json")
    declared = None
    if os.path.exists(cfg_path):
        with open(cfg_path) as f:
            declared = json.load(f).get("world_size")
    if not sizes:
        raise CheckpointFormatError(
            f"{local_dir} holds no {kind}_world_size_<W>_rank_<r>.pt shard files (found: {_describe(local_dir)}); "
            "expected an FSDP checkpoint folder such as <default_local_dir>/global_step_N/actor with "
            f"'{'model' if kind == 'model' else 'optimizer'}' in checkpoint.save_contents")
    if len(sizes) > 1 or (declared is not None and int(declared) not in sizes):
        raise CheckpointFormatError(
            f"{local_dir} mixes shard files of world sizes {sorted(sizes)} (fsdp_config.json says {declared}); "
            "expected the files of one save only")
    world = next(iter(sizes))
    missing = sorted(set(range(world)) - sizes[world])
    if missing:
        raise CheckpointFormatError(f"{local_dir}: the checkpoint was saved by {world} ranks but the {kind} files of "
                                    f"ranks {missing} are missing (found: {_describe(local_dir)})")
    return world


def _coordinate(mesh, rank: int) -> tuple[int, ...]:
    """Where global rank ``rank`` sits in ``mesh`` (read from the mesh's rank layout, valid in any process)."""
    hits = (mesh.mesh == rank).nonzero()
    if hits.numel() == 0:
        raise CheckpointFormatError(f"rank {rank}'s file holds a tensor whose device mesh {mesh.mesh.tolist()} does "
                                    "not contain that rank")
    return tuple(int(i) for i in hits[0].tolist())


def _from_dtensor(value: DTensor, rank: int) -> SavedShard:
    return SavedShard(value._local_tensor, tuple(value.placements), _coordinate(value.device_mesh, rank),
                      tuple(value.shape))


def _placement_from_json(p: list) -> Placement:
    if p[0] == "shard":
        return Shard(int(p[1]))
    if p[0] == "replicate":
        return Replicate()
    raise CheckpointFormatError(f"unknown placement {p!r} in a checkpoint file; expected shard or replicate")


def _load(path: str):
    try:
        return torch.load(path, map_location="cpu", weights_only=False, mmap=True)
    except RuntimeError:  # files written without the zip container cannot be memory-mapped
        return torch.load(path, map_location="cpu", weights_only=False)


def read_model_file(path: str, rank: int) -> dict:
    """``{key: SavedShard | Tensor}`` of one rank's model file, in either layout."""
    obj = _load(path)
    if not isinstance(obj, dict):
        raise CheckpointFormatError(f"{path} holds a {type(obj).__name__}; expected a model state dict (verl's "
                                    "FSDP layout: torch.save(model.state_dict()))")
    if "format" in obj and "state_dict" in obj:
        if obj["format"] != WRAPPED_FORMAT:
            raise CheckpointFormatError(f"{path} has format {obj['format']!r}; readable formats are verl's "
                                        f"(a plain state dict) and {WRAPPED_FORMAT!r}")
        out = {}
        for key, value in obj["state_dict"].items():
            meta = obj.get("dtensor", {}).get(key)
            if meta is None:
                out[key] = value
            else:
                out[key] = SavedShard(value, tuple(_placement_from_json(p) for p in meta["placements"]),
                                      tuple(meta["coordinate"]) or (rank,), tuple(meta["shape"]))
        return out
    bad = [k for k, v in obj.items() if not isinstance(k, str) or not isinstance(v, torch.Tensor)]
    if bad:
        raise CheckpointFormatError(
            f"{path} is a dict whose entries are not all named tensors (e.g. {bad[:3]}); expected "
            f"model.state_dict() (verl's FSDP layout) or {{'format': {WRAPPED_FORMAT!r}, 'state_dict', 'dtensor'}}")
    return {k: _from_dtensor(v, rank) if isinstance(v, DTensor) else v for k, v in obj.items()}


def read_optim_file(path: str, rank: int) -> dict:
    """``{"state": {idx: {name: SavedShard | Tensor | value}}, "param_groups": [...]}`` in either layout."""
    obj = _load(path)
    if not isinstance(obj, dict):
        raise CheckpointFormatError(f"{path} holds a {type(obj).__name__}; expected optimizer.state_dict()")
    if "format" in obj and "state_dict" in obj:  # wrapped: local tensors, placements not recorded
        sd = obj["state_dict"]
        dtensor_keys = {(int(i), k) for i, k in obj.get("dtensor_keys", [])}
        state = {idx: {k: ("local", v) if (int(idx), k) in dtensor_keys else v for k, v in entry.items()}
                 for idx, entry in sd["state"].items()}
        return {"state": state, "param_groups": sd["param_groups"], "wrapped": True}
    if "state" not in obj or "param_groups" not in obj:
        raise CheckpointFormatError(f"{path} has keys {sorted(obj)[:6]}; expected optimizer.state_dict() with "
                                    "'state' and 'param_groups'")
    state = {idx: {k: _from_dtensor(v, rank) if isinstance(v, DTensor) else v for k, v in entry.items()}
             for idx, entry in obj["state"].items()}
    return {"state": state, "param_groups": obj["param_groups"], "wrapped": False}


def full_tensor(key: str, pieces: list[SavedShard]) -> torch.Tensor:
    """The full tensor from every rank's piece: replicas read once, shards concatenated in mesh order
    (FSDP2 cuts like ``torch.chunk``, so the later pieces may be shorter or empty)."""
    first = pieces[0]
    shard_dims = [(i, p.dim) for i, p in enumerate(first.placements) if isinstance(p, Shard)]
    if any(type(p) not in (Shard, Replicate) for p in first.placements):
        raise CheckpointFormatError(f"{key}: placements {first.placements} cannot be merged; supported are Shard(d) "
                                    "on one mesh dimension and Replicate()")
    if len(shard_dims) > 1:
        raise CheckpointFormatError(f"{key}: sharded over several mesh dimensions {first.placements}; supported is "
                                    "one Shard mesh dimension (FSDP or HSDP)")
    repl = [i for i, p in enumerate(first.placements) if isinstance(p, Replicate)]
    chosen = [s for s in pieces if all(s.coordinate[i] == 0 for i in repl)]
    if not shard_dims:
        return chosen[0].local
    mesh_dim, tensor_dim = shard_dims[0]
    chosen.sort(key=lambda s: s.coordinate[mesh_dim])
    full = torch.cat([s.local for s in chosen], dim=tensor_dim)
    if tuple(full.shape) != tuple(first.shape):
        raise CheckpointFormatError(f"{key}: the saved pieces make shape {tuple(full.shape)} but the checkpoint "
                                    f"records {tuple(first.shape)}; are shard files of another save mixed in?")
    return full


def own_storage(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Every tensor contiguous and owning exactly its storage (safetensors refuses views into larger buffers,
    which gathered FSDP shards often are); tensors that already do are not copied."""
    out = {}
    for k, v in state.items():
        whole = v.is_contiguous() and v.storage_offset() == 0 and \
            v.untyped_storage().nbytes() == v.numel() * v.element_size()
        out[k] = v if whole else v.contiguous().clone()
    return out


def load_full_model_state(local_dir: str) -> dict[str, torch.Tensor]:
    """Full (unsharded) model state dict of a checkpoint folder, names as the training model had them."""
    local_dir = os.path.abspath(os.path.expanduser(local_dir))
    if not os.path.isdir(local_dir):
        raise FileNotFoundError(f"checkpoint folder {local_dir} does not exist")
    world = saved_world_size(local_dir, "model")
    ranks = [read_model_file(os.path.join(local_dir, model_file(world, r)), r) for r in range(world)]
    out = {}
    for key, value in ranks[0].items():
        if isinstance(value, SavedShard):
            out[key] = full_tensor(key, [rk[key] for rk in ranks]).clone()
        else:
            out[key] = value.clone()
    return out
