"""Rebuild full weights from the per-rank shard files of ``FSDPCheckpointManager`` (CPU only, no process group).

Each rank file holds its local shard of every tensor with the DTensor placement and mesh coordinate; full
tensors are the concatenation of the shards along the sharded dim, in mesh order (replicas of an HSDP mesh are
read once). LoRA checkpoints (``lora_train_meta.json``) are merged: W + (lora_alpha / r) * B @ A, under the base
model's names.
"""

from __future__ import annotations

import json
import os
import re

import torch

from verl.model_merger.base_model_merger import BaseModelMerger
from verl.utils.checkpoint.fsdp_checkpoint_manager import model_file
from verl.utils.fsdp_utils import hf_name


def _world_size(local_dir: str) -> int:
    cfg = os.path.join(local_dir, "fsdp_config.json")
    if os.path.exists(cfg):
        with open(cfg) as f:
            return int(json.load(f)["world_size"])
    sizes = {int(m.group(1)) for n in os.listdir(local_dir) if (m := re.match(r"model_world_size_(\d+)_rank_\d+\.pt$", n))}
    if len(sizes) != 1:
        raise FileNotFoundError(f"{local_dir} holds no model_world_size_*_rank_*.pt shard files (or several world "
                                "sizes): is it a checkpoint folder like .../global_step_N/actor with 'model' saved?")
    return sizes.pop()


def _merge_tensor(key: str, shards: list[tuple[list, torch.Tensor]], meta: dict) -> torch.Tensor:
    placements = meta["placements"]
    shard_dims = [(i, p[1]) for i, p in enumerate(placements) if p[0] == "shard"]
    repl_dims = [i for i, p in enumerate(placements) if p[0] == "replicate"]
    chosen = [(c, t) for c, t in shards if all(c[i] == 0 for i in repl_dims)]
    if not shard_dims:
        return chosen[0][1]
    if len(shard_dims) > 1:
        raise NotImplementedError(f"{key}: sharded over several mesh dims {placements}; not supported by the merger")
    mesh_dim, tensor_dim = shard_dims[0]
    chosen.sort(key=lambda ct: ct[0][mesh_dim])
    full = torch.cat([t for _, t in chosen], dim=tensor_dim)
    if list(full.shape) != list(meta["shape"]):
        raise ValueError(f"{key}: merged shape {list(full.shape)} != saved global shape {meta['shape']}")
    return full


def load_fsdp_checkpoint(local_dir: str) -> dict[str, torch.Tensor]:
    """Full (unsharded) state dict with the names the training model had (peft names for LoRA models)."""
    local_dir = os.path.abspath(os.path.expanduser(local_dir))
    if not os.path.isdir(local_dir):
        raise FileNotFoundError(f"checkpoint folder {local_dir} does not exist")
    world = _world_size(local_dir)
    ranks = []
    for r in range(world):
        path = os.path.join(local_dir, model_file(world, r))
        if not os.path.exists(path):
            raise FileNotFoundError(f"missing shard file {path} (the checkpoint was saved by {world} ranks)")
        ranks.append(torch.load(path, map_location="cpu", weights_only=False))
    out = {}
    for key, value in ranks[0]["state_dict"].items():
        meta = ranks[0]["dtensor"].get(key)
        if meta is None:
            out[key] = value
        else:
            shards = [(rk["dtensor"][key]["coordinate"], rk["state_dict"][key]) for rk in ranks]
            out[key] = _merge_tensor(key, shards, meta)
    return out


def merge_lora(state_dict: dict[str, torch.Tensor], scaling: float) -> dict[str, torch.Tensor]:
    """peft-named state dict -> base HF names with W + scaling * B @ A folded into each adapted weight."""
    out = {}
    for key, value in state_dict.items():
        name = hf_name(key)
        if name is None:
            continue
        if key.endswith(".base_layer.weight"):
            prefix = key[: -len(".base_layer.weight")]
            a, b = state_dict.get(f"{prefix}.lora_A.default.weight"), state_dict.get(f"{prefix}.lora_B.default.weight")
            if a is not None and b is not None:
                value = (value.float() + scaling * (b.float() @ a.float())).to(value.dtype)
        out[name] = value
    return out


class FSDPModelMerger(BaseModelMerger):
    def full_state_dict(self) -> dict[str, torch.Tensor]:
        state = load_fsdp_checkpoint(self.local_dir)
        lora_meta = os.path.join(self.local_dir, "lora_train_meta.json")
        if os.path.exists(lora_meta):
            with open(lora_meta) as f:
                meta = json.load(f)
            state = merge_lora(state, float(meta["lora_alpha"]) / float(meta["r"]))
        return state

    def merge_and_save(self) -> str:
        if not self.config.target_dir:
            raise ValueError("merge needs --target_dir")
        out = self.save_hf_model(self.full_state_dict(), self.config.target_dir)
        print(f"merged {self.local_dir} -> {out}")
        return out

    def test(self) -> None:
        from safetensors.torch import load_file

        ref_dir = self.config.test_hf_dir
        files = [f for f in os.listdir(ref_dir) if f.endswith(".safetensors")]
        if not files:
            raise FileNotFoundError(f"--test_hf_dir {ref_dir} has no .safetensors weights")
        ref = {}
        for f in files:
            ref.update(load_file(os.path.join(ref_dir, f)))
        merged = self.full_state_dict()
        for k, v in ref.items():
            if k not in merged:
                raise ValueError(f"{k} is in {ref_dir} but not in the checkpoint")
            if not torch.allclose(merged[k].float(), v.float(), atol=1e-6, rtol=1e-5):
                raise ValueError(f"{k} differs: max |diff| = {(merged[k].float() - v.float()).abs().max().item()}")
        print(f"checkpoint {self.local_dir} matches {ref_dir} ({len(ref)} tensors)")
