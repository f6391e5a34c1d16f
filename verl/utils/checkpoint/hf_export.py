"""Write a trained (possibly FSDP2-sharded, possibly LoRA-wrapped) model as a plain Hugging Face directory.

Layout under ``trainer.default_local_dir`` (verl's)::

    global_step_N/huggingface/   config.json, generation_config.json, model*.safetensors (split at
                                 max_shard_size, with model.safetensors.index.json), tokenizer files
    latest_checkpointed_iteration.txt   "N"

``global_step_N/huggingface`` is what ``actor_rollout_ref.model.path`` (main_ppo) and
``AutoModelForCausalLM.from_pretrained`` take. The directory is written to a temporary sibling and renamed into
place, so a reader never sees a half-written model.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile

import torch
import torch.distributed as dist
from huggingface_hub import save_torch_state_dict
from transformers import GenerationConfig

from verl.utils.checkpoint.fsdp_layout import own_storage
from verl.utils.fs import atomic_write_text
from verl.utils.fsdp_utils import get_full_state_dict
from verl.utils.model import unwrap_peft

__all__ = ["HF_SUBDIR", "LATEST_FILE", "save_hf_model_dir", "step_dir", "prune_checkpoints", "latest_step"]

HF_SUBDIR = "huggingface"
LATEST_FILE = "latest_checkpointed_iteration.txt"


def step_dir(root: str, step: int) -> str:
    return os.path.join(root, f"global_step_{step}")


def _base_config(model):
    base = unwrap_peft(model)
    return base.config, getattr(base, "generation_config", None)


def save_hf_model_dir(model, tokenizer, out_dir: str, rank: int = 0, max_shard_size: str | int = "5GB") -> str | None:
    """Gather the full weights (collective: every rank calls this) and write them as an HF dir on rank 0.

    LoRA adapters are merged into the base weights (names are the base model's). A tied ``lm_head.weight``
    is left out, as ``save_pretrained`` does. Returns ``out_dir`` on rank 0, None elsewhere.
    """
    state = get_full_state_dict(model, rank0_only=True)
    config, gen_config = _base_config(model)
    if dist.is_initialized():
        dist.barrier()
    if rank != 0:
        return None
    if getattr(config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)
    state = own_storage(state)
    out_dir = os.path.abspath(out_dir)
    parent = os.path.dirname(out_dir)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(out_dir)}.tmp-", dir=parent)
    try:
        save_torch_state_dict(state, tmp, max_shard_size=max_shard_size, metadata={"format": "pt"})
        config = config.__class__.from_dict(config.to_dict())  # a copy: never mutate the live model's config
        config.torch_dtype = next(iter(state.values())).dtype if state else torch.float32
        config.save_pretrained(tmp)
        (gen_config if gen_config is not None else GenerationConfig.from_model_config(config)).save_pretrained(tmp)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        if os.path.exists(out_dir):
            old = tempfile.mkdtemp(prefix=f".{os.path.basename(out_dir)}.old-", dir=parent)
            os.rename(out_dir, os.path.join(old, "x"))
            shutil.rmtree(old, ignore_errors=True)
        os.rename(tmp, out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def mark_latest(root: str, step: int) -> None:
    atomic_write_text(os.path.join(root, LATEST_FILE), str(step))


def latest_step(root: str) -> int | None:
    path = os.path.join(os.path.expanduser(root), LATEST_FILE)
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        text = f.read().strip()
    return int(text) if text.isdigit() else None


def prune_checkpoints(root: str, keep: int | None) -> list[str]:
    """Delete all but the newest ``keep`` ``global_step_*`` dirs (None or <= 0: keep all); returns the removed."""
    if not keep or keep <= 0 or not os.path.isdir(root):
        return []
    steps = sorted(
        int(m.group(1)) for name in os.listdir(root) if (m := re.fullmatch(r"global_step_(\d+)", name))
    )
    removed = []
    for step in steps[:-keep]:
        path = step_dir(root, step)
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed
