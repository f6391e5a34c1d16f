"""Adapter-only LoRA weight push for the vLLM rollout: the pure pieces (names, config, atomic directory write).

With ``actor_rollout_ref.model.lora_rank > 0`` the vLLM engine is started with ``enable_lora=True``; the frozen
base weights reach it once, and every later push hands over only the PEFT adapter: the ``lora_A`` / ``lora_B``
tensors under the names PEFT saves (``base_model.model.<module>.lora_A.weight``) plus ``adapter_config.json``,
written to a fresh directory (under ``/dev/shm`` when it exists, so nothing touches a disk) that vLLM loads in
place under one fixed adapter id.
"""

from __future__ import annotations

import enum
import json
import os
import re
import shutil
import tempfile
from typing import Any, Iterable

import torch
from safetensors.torch import save_file

__all__ = ["VLLM_LORA_RANKS", "vllm_max_lora_rank", "peft_adapter_name", "adapter_config_dict",
           "write_adapter_dir", "default_adapter_root"]

# the ranks vLLM's LoRAConfig.max_lora_rank accepts
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
_ADAPTER_SEGMENT = re.compile(r"\.(lora_[AB])\.[^.]+\.weight$")


def vllm_max_lora_rank(rank: int) -> int:
    """The smallest ``max_lora_rank`` vLLM accepts that holds an adapter of rank ``rank``."""
    for allowed in VLLM_LORA_RANKS:
        if rank <= allowed:
            return allowed
    raise ValueError(f"actor_rollout_ref.model.lora_rank={rank} is above the largest LoRA rank vLLM serves "
                     f"({VLLM_LORA_RANKS[-1]}); lower it or set actor_rollout_ref.rollout.lora_merge=True")


def peft_adapter_name(state_dict_key: str) -> str | None:
    """A PEFT model's state-dict key -> the name PEFT writes in ``adapter_model.safetensors`` (and vLLM reads);
    None for keys that are not LoRA A/B matrices.

    ``base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight`` ->
    ``base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight`` (the adapter name is dropped).
    """
    if not _ADAPTER_SEGMENT.search(state_dict_key):
        return None
    return _ADAPTER_SEGMENT.sub(r".\1.weight", state_dict_key)


def _jsonable(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (set, frozenset, tuple)):
        return sorted(_jsonable(v) for v in value) if isinstance(value, (set, frozenset)) else [
            _jsonable(v) for v in value]
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return value


def adapter_config_dict(peft_config: Any) -> dict:
    """``adapter_config.json`` contents from a peft ``LoraConfig`` (or a plain dict): JSON-safe, with the
    fields vLLM checks (``peft_type``, ``r``, ``lora_alpha``, ``target_modules``) present."""
    raw = peft_config.to_dict() if hasattr(peft_config, "to_dict") else dict(peft_config)
    config = _jsonable(raw)
    config.setdefault("peft_type", "LORA")
    missing = [k for k in ("r", "lora_alpha", "target_modules") if config.get(k) in (None, [], "")]
    if missing:
        raise ValueError(f"LoRA adapter config lacks {missing}; cannot hand the adapter to vLLM")
    return config


def default_adapter_root() -> str:
    """A private directory for the pushed adapters: in ``/dev/shm`` (memory) when it exists, else the temp dir."""
    base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    return tempfile.mkdtemp(prefix="verl_lora_push_", dir=base)


def write_adapter_dir(root: str, version: int, tensors: Iterable[tuple[str, torch.Tensor]], config: dict) -> str:
    """Write ``root/v<version>`` (PEFT layout: safetensors + ``adapter_config.json``) atomically.

    The files go to a hidden sibling first and the directory is renamed into place, so vLLM never reads a
    half-written adapter. Older versions under ``root`` are removed after the new one is in place. Returns the
    new directory.
    """
    os.makedirs(root, exist_ok=True)
    final = os.path.join(root, f"v{int(version)}")
    tmp = tempfile.mkdtemp(prefix=f".v{int(version)}.tmp-", dir=root)
    try:
        weights = {name: t.detach().contiguous().cpu() for name, t in tensors}
        if not weights:
            raise ValueError("no LoRA tensors to push (is the actor a PEFT LoRA model?)")
        save_file(weights, os.path.join(tmp, ADAPTER_WEIGHTS), metadata={"format": "pt"})
        with open(os.path.join(tmp, ADAPTER_CONFIG), "w") as f:
            json.dump(config, f, indent=1)
        if os.path.exists(final):
            shutil.rmtree(final)
        os.rename(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for entry in os.listdir(root):
        if entry != os.path.basename(final) and not entry.startswith("."):
            shutil.rmtree(os.path.join(root, entry), ignore_errors=True)
    return final
