"""Rebuild full weights from the per-rank shard files of an FSDP checkpoint (CPU only, no process group).

Reads verl's layout (``torch.save(model.state_dict())`` of FSDP2 DTensors per rank) and this package's older
wrapped files (:mod:`verl.utils.checkpoint.fsdp_layout`): full tensors are the saved pieces concatenated along
the sharded dim in mesh order (replicas of an HSDP mesh read once). LoRA checkpoints (``lora_adapter/`` or
``lora_train_meta.json``) are merged: W + (lora_alpha / r) * B @ A, under the base model's names.
"""

from __future__ import annotations

import json
import os

import torch
from safetensors.torch import load_file

from verl.model_merger.base_model_merger import BaseModelMerger
from verl.utils.checkpoint.fsdp_layout import load_full_model_state
from verl.utils.fsdp_utils import hf_name


def load_fsdp_checkpoint(local_dir: str) -> dict[str, torch.Tensor]:
    """Full (unsharded) state dict with the names the training model had (peft names for LoRA models)."""
    return load_full_model_state(local_dir)


def _lora_scaling(local_dir: str) -> float | None:
    for path in (os.path.join(local_dir, "lora_adapter", "adapter_config.json"),
                 os.path.join(local_dir, "lora_train_meta.json")):
        if os.path.exists(path):
            with open(path) as f:
                meta = json.load(f)
            return float(meta["lora_alpha"]) / float(meta["r"])
    return None


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
        scaling = _lora_scaling(self.local_dir)
        if scaling is not None or any("lora_" in k for k in state):
            if scaling is None:
                raise ValueError(f"{self.local_dir} holds LoRA weights but neither lora_adapter/adapter_config.json "
                                 "nor lora_train_meta.json, so lora_alpha / r is unknown")
            state = merge_lora(state, scaling)
        return state

    def merge_and_save(self) -> str:
        if not self.config.target_dir:
            raise ValueError("merge needs --target_dir")
        out = self.save_hf_model(self.full_state_dict(), self.config.target_dir)
        print(f"merged {self.local_dir} -> {out}")
        return out

    def test(self) -> None:
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
