"""Megatron engine checkpoints through megatron-core's dist-checkpointing (sharded, layout-independent).

Layout of ``<local_path>`` (verl's ``global_step_N/actor``)::

    dist_ckpt/          model + optimizer state as global sharded tensors (torch_dist format): any
                        tensor / pipeline layout can load it (TP=2 -> TP=1, PP=2 -> PP=1)
    extra_state.pt      LR-scheduler state and the optimizer step count (identical on every rank)
    huggingface/        the HF config (+ tokenizer); with ``checkpoint.save_contents`` holding ``hf_model``
                        also the full weights (what ``verl.model_merger --backend megatron`` would write)

Optimizer moments (``exp_avg``, ``exp_avg_sq``) are saved as sharded tensors laid out like their parameter,
so they reshard with it. ``<root>/latest_checkpointed_iteration.txt`` is the trainer's business.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import torch
import torch.distributed as dist
from safetensors.torch import save_file

from verl.utils.checkpoint.hf_export import prune_checkpoints

__all__ = ["MegatronCheckpointer", "write_hf_dir", "DIST_CKPT", "EXTRA", "HF_DIR"]

DIST_CKPT = "dist_ckpt"
EXTRA = "extra_state.pt"
HF_DIR = "huggingface"
_MOMENTS = ("exp_avg", "exp_avg_sq")


def _contents(cfg, key: str) -> set:
    default = ["model", "optimizer", "extra"]
    if cfg is None:
        return set(default)
    value = cfg.get(key) if hasattr(cfg, "get") else None
    return set(value if value is not None else default)


def _model_key(chunk: int, num_chunks: int) -> str:
    return "model" if num_chunks == 1 else f"model{chunk}"


def _local_optimizer(optimizer):
    """The optimizer holding this rank's state (ZeroRedundancyOptimizer keeps a local one)."""
    return getattr(optimizer, "optim", optimizer)


class MegatronCheckpointer:
    """Save / load a :class:`~verl.workers.engine.megatron.MegatronEngine` (collective calls)."""

    def __init__(self, engine):
        self.engine = engine
        cfg = engine.checkpoint_config or {}
        self.save_contents = _contents(cfg, "save_contents")
        self.load_contents = _contents(cfg, "load_contents")

    # ------------------------------------------------------------------ sharded state
    def _sharded_state(self, for_load: bool) -> dict:
        # optional heavy dependency: megatron-core (~10 s to import) is needed only with strategy=megatron
        from megatron.core.dist_checkpointing.optimizer import make_sharded_optimizer_tensor

        # the sharded tensors' keys are global (layer numbers included), so the nesting below is this process's
        # own: one "model" entry, or "model<v>" per model chunk with virtual pipeline stages
        chunks = self.engine.chunks
        state = {}
        opt = _local_optimizer(self.engine.optimizer)
        zero = opt is not self.engine.optimizer
        owned = {id(p) for g in opt.param_groups for p in g["params"]}
        optim_sd = {}
        for v, model in enumerate(chunks):
            model_sd = model.sharded_state_dict()
            state[_model_key(v, len(chunks))] = model_sd
            for name, param in model.named_parameters():
                if id(param) not in owned or name not in model_sd:
                    continue
                st = opt.state.get(param)
                if for_load and not st:
                    st = opt.state[param] = {m: torch.zeros_like(param) for m in _MOMENTS}
                if not st:
                    continue
                for m in _MOMENTS:
                    sh = make_sharded_optimizer_tensor(model_sd[name], st[m], f"optimizer.state.{m}")
                    if zero and hasattr(sh, "replica_id") and isinstance(sh.replica_id, tuple):
                        sh.replica_id = (*sh.replica_id[:-1], 0)  # the rank owning the state is its only copy
                    optim_sd[f"{m}.{v}.{name}"] = sh
        if for_load and "optimizer" not in self.load_contents:
            optim_sd = {}
        if optim_sd:
            state["optimizer"] = optim_sd
        return state

    # ------------------------------------------------------------------ save / load
    def save(self, local_path: str, global_step: int = 0, max_ckpt_to_keep: int | None = None) -> None:
        # optional heavy dependency: megatron-core (~10 s to import) is needed only with strategy=megatron
        from megatron.core import dist_checkpointing

        rank = dist.get_rank()
        local_path = os.path.abspath(local_path)
        ckpt_dir = os.path.join(local_path, DIST_CKPT)
        if rank == 0:
            if os.path.exists(ckpt_dir):
                shutil.rmtree(ckpt_dir)
            os.makedirs(ckpt_dir, exist_ok=True)
        dist.barrier()
        state = self._sharded_state(for_load=False)
        if "optimizer" not in self.save_contents:
            state.pop("optimizer", None)
        dist_checkpointing.save(state, ckpt_dir)
        if rank == 0:
            opt = _local_optimizer(self.engine.optimizer)
            steps = [int(s["step"]) for s in opt.state.values() if "step" in s]
            extra = {"global_step": int(global_step), "optimizer_step": max(steps) if steps else 0,
                     "lr_scheduler": self.engine.lr_scheduler.state_dict() if self.engine.lr_scheduler else None}
            torch.save(extra, os.path.join(local_path, EXTRA))
        hf_dir = os.path.join(local_path, HF_DIR)
        if "hf_model" in self.save_contents:
            self.engine.save_hf_model(hf_dir)
        elif rank == 0:
            os.makedirs(hf_dir, exist_ok=True)
            config = self.engine.hf_config.__class__.from_dict(self.engine.hf_config.to_dict())
            if self.engine.value_head:
                config.num_labels = 1
            config.save_pretrained(hf_dir)
            if self.engine.tokenizer is not None:
                self.engine.tokenizer.save_pretrained(hf_dir)
        dist.barrier()
        if rank == 0 and max_ckpt_to_keep:
            prune_checkpoints(os.path.dirname(local_path.rstrip("/")), max_ckpt_to_keep)

    def load(self, local_path: str, del_local_after_load: bool = False) -> None:
        # optional heavy dependency: megatron-core (~10 s to import) is needed only with strategy=megatron
        from megatron.core import dist_checkpointing

        ckpt_dir = os.path.join(local_path, DIST_CKPT)
        if not os.path.isdir(ckpt_dir):
            raise FileNotFoundError(f"{local_path}: no {DIST_CKPT}/ here; a Megatron checkpoint is a directory "
                                    f"written by a Megatron engine (global_step_N/actor or .../critic)")
        state = self._sharded_state(for_load=True)
        loaded = dist_checkpointing.load(state, ckpt_dir)
        chunks = self.engine.chunks
        for v, chunk in enumerate(chunks):
            chunk.load_state_dict(loaded[_model_key(v, len(chunks))], strict=False)
        if "optimizer" in loaded and "optimizer" in self.load_contents:
            extra = torch.load(os.path.join(local_path, EXTRA), weights_only=False)
            opt = _local_optimizer(self.engine.optimizer)
            params = [dict(c.named_parameters()) for c in chunks]
            for key, value in loaded["optimizer"].items():
                moment, v, name = key.split(".", 2)
                opt.state[params[int(v)][name]][moment].copy_(value)
            for st in opt.state.values():
                st["step"] = torch.tensor(float(extra["optimizer_step"]))
        if "extra" in self.load_contents and self.engine.lr_scheduler is not None:
            extra = torch.load(os.path.join(local_path, EXTRA), weights_only=False)
            if extra.get("lr_scheduler") is not None:
                self.engine.lr_scheduler.load_state_dict(extra["lr_scheduler"])
        dist.barrier()
        if del_local_after_load and dist.get_rank() == 0:
            shutil.rmtree(local_path, ignore_errors=True)


def write_hf_dir(params, hf_config, out_dir: str, tokenizer=None, value_head: bool = False,
                 write: bool = True) -> str | None:
    """Consume a ``(hf_name, tensor)`` stream (every rank must, it is collective) and, where ``write``, save it as
    an HF model directory (safetensors, config, tokenizer), built in a temporary sibling and renamed into place."""
    state = {}
    for name, tensor in params:
        if write:
            state[name] = tensor.detach().cpu().contiguous().clone()
    if not write:
        return None
    tied = bool(getattr(hf_config, "tie_word_embeddings", False))
    if tied and not value_head:
        state.pop("lm_head.weight", None)
    out_dir = os.path.abspath(out_dir)
    parent = os.path.dirname(out_dir)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(out_dir)}.tmp-", dir=parent)
    try:
        save_file(state, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
        config = hf_config.__class__.from_dict(hf_config.to_dict())
        if value_head:
            arch = (config.architectures or ["ForCausalLM"])[0]
            config.architectures = [arch.replace("ForCausalLM", "ForTokenClassification")]
            config.num_labels = 1
        config.torch_dtype = next(iter(state.values())).dtype
        config.save_pretrained(tmp)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        if os.path.exists(out_dir):
            shutil.rmtree(out_dir)
        os.rename(tmp, out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out_dir
