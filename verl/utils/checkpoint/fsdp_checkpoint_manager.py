"""Sharded checkpoints of an FSDP2 model, its optimizer and scheduler, in verl's layout, plus a Hugging Face folder.

Layout of ``local_path`` (e.g. ``.../global_step_10/actor``), W = world size, r = rank::

    model_world_size_{W}_rank_{r}.pt        model.state_dict() of this rank (DTensors: local shard + placement)
    optim_world_size_{W}_rank_{r}.pt        optimizer.state_dict() of this rank (DTensor moments)
    extra_state_world_size_{W}_rank_{r}.pt  {"lr_scheduler": state dict, "rng": torch/numpy/random/device states}
    fsdp_config.json                        {"FSDP_version": 2, "world_size": W}
    lora_train_meta.json, lora_adapter/     for a peft LoRA model (adapter_config.json + adapter weights)
    huggingface/                            config.json, generation_config.json, tokenizer files
                                            (+ sharded safetensors with full, LoRA-merged weights for "hf_model")

Checkpoints written by verl and the older wrapped files of this package are both read
(:mod:`verl.utils.checkpoint.fsdp_layout`). Loading on another number of ranks reshards: each entry's full tensor
is rebuilt from the W saved pieces and every rank keeps its own piece. Everything is written to
``<local_path>.tmp`` first and renamed once every rank is done, so a crash never leaves a half-written
``local_path``.
"""

from __future__ import annotations

import copy
import json
import os
import shutil

import torch
from huggingface_hub import save_torch_state_dict
from peft import get_peft_model_state_dict
from torch.distributed.tensor import DTensor, distribute_tensor

from verl.utils.checkpoint.checkpoint_manager import BaseCheckpointManager, barrier
from verl.utils.checkpoint.fsdp_layout import (
    CheckpointFormatError,
    SavedShard,
    extra_file,
    full_tensor,
    model_file,
    optim_file,
    own_storage,
    read_model_file,
    read_optim_file,
    saved_world_size,
)
from verl.utils.fsdp_utils import get_full_state_dict, is_peft_model
from verl.utils.model import unwrap_peft

__all__ = ["FSDPCheckpointManager", "model_file", "optim_file", "extra_file"]


def _cpu(value):
    """A CPU copy of a (DTensor) state entry, keeping its placement and mesh, so files load on any machine."""
    if isinstance(value, DTensor):
        local = value.to_local().detach().cpu().clone()
        return DTensor.from_local(local, value.device_mesh, value.placements, run_check=False, shape=value.shape,
                                  stride=value.stride())
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().clone()
    return value


def _flat_params(optimizer) -> list:
    return [p for group in optimizer.param_groups for p in group["params"]]


def _place_like(full: torch.Tensor, target: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``full`` laid out like ``target``: this rank's piece as a DTensor (no communication: every rank holds
    ``full``), or the whole tensor."""
    if isinstance(target, DTensor):
        local = target.to_local()
        return distribute_tensor(full.to(local.device, dtype or local.dtype), target.device_mesh, target.placements,
                                 src_data_rank=None)
    return full.to(target.device, dtype or target.dtype)


class _RankFiles:
    """The W saved files of one kind, read lazily (a same-size resume reads only this rank's file)."""

    def __init__(self, local_path: str, kind: str, reader, name_fn):
        self.world = saved_world_size(local_path, kind)
        self._paths = [os.path.join(local_path, name_fn(self.world, r)) for r in range(self.world)]
        self._reader = reader
        self._cache: dict[int, dict] = {}

    def __getitem__(self, rank: int) -> dict:
        if rank not in self._cache:
            self._cache[rank] = self._reader(self._paths[rank], rank)
        return self._cache[rank]

    def all(self) -> list[dict]:
        return [self[r] for r in range(self.world)]


class FSDPCheckpointManager(BaseCheckpointManager):
    """``save_checkpoint`` / ``load_checkpoint`` for an FSDP2 (or unsharded) model, optimizer and lr scheduler.

    ``processing_class`` (a tokenizer or processor) is saved under ``huggingface/``; ``checkpoint_config`` is
    the role's typed ``checkpoint`` section (``save_contents``, ``load_contents``) or None.
    """

    max_shard_size: str = "5GB"

    # ------------------------------------------------------------------------------------------------ save
    def save_checkpoint(self, local_path: str, hdfs_path: str | None = None, global_step: int = 0,
                        max_ckpt_to_keep: int | None = None) -> None:
        if local_path is None:
            return
        if isinstance(hdfs_path, int) and not global_step:  # save_checkpoint(path, step) positional form
            hdfs_path, global_step = None, hdfs_path
        local_path = os.path.abspath(os.path.expanduser(local_path))
        tmp = f"{local_path}.tmp"
        W, r = self.world_size, self.rank
        if r == 0:
            shutil.rmtree(tmp, ignore_errors=True)
            os.makedirs(tmp)
        barrier()

        if self.should_save_model:
            torch.save({k: _cpu(v) for k, v in self.model.state_dict().items()}, os.path.join(tmp, model_file(W, r)))
        if self.should_save_optimizer:
            sd = self.optimizer.state_dict()
            sd["state"] = {i: {k: _cpu(v) for k, v in entry.items()} for i, entry in sd["state"].items()}
            torch.save(sd, os.path.join(tmp, optim_file(W, r)))
        if self.should_save_extra:
            extra = {"lr_scheduler": self.lr_scheduler.state_dict() if self.lr_scheduler is not None else None,
                     "rng": self.get_rng_state()}
            torch.save(extra, os.path.join(tmp, extra_file(W, r)))
        full = get_full_state_dict(self.model, rank0_only=True) if self.should_save_hf_model else None
        adapter = self._full_adapter_state() if is_peft_model(self.model) else None
        if r == 0:
            self._save_hf_side(tmp, full, adapter)
            with open(os.path.join(tmp, "fsdp_config.json"), "w") as f:
                json.dump({"FSDP_version": 2, "world_size": W}, f)
        barrier()

        if r == 0:
            old = f"{local_path}.old"
            shutil.rmtree(old, ignore_errors=True)
            if os.path.exists(local_path):
                os.replace(local_path, old)
            os.replace(tmp, local_path)
            shutil.rmtree(old, ignore_errors=True)
        barrier()
        self.previous_global_step = global_step
        self._register_saved(local_path, max_ckpt_to_keep)

    def _full_adapter_state(self) -> dict[str, torch.Tensor]:
        """Full LoRA weights (collective: every rank gathers the same adapter tensors, in the same order)."""
        out = {}
        for key, value in self.model.state_dict().items():
            if "lora_" in key:
                out[key] = (value.full_tensor() if isinstance(value, DTensor) else value).detach().cpu()
        return out

    def _save_hf_side(self, path: str, full_state_dict: dict | None, adapter: dict | None) -> None:
        hf_dir = os.path.join(path, "huggingface")
        os.makedirs(hf_dir, exist_ok=True)
        base = unwrap_peft(self.model)
        config = getattr(base, "config", None)
        if config is not None:
            config = copy.deepcopy(config)
            config.architectures = [type(base).__name__]
            config.save_pretrained(hf_dir)
        gen = getattr(base, "generation_config", None)
        if gen is not None:
            try:
                gen.save_pretrained(hf_dir)
            except ValueError as err:  # an invalid generation config must not block the checkpoint
                print(f"generation_config.json not written to {hf_dir}: {err}")
        if self.processing_class is not None:
            self.processing_class.save_pretrained(hf_dir)
        if adapter is not None:
            peft_cfg = self.model.peft_config[self.model.active_adapter]
            meta = {"r": peft_cfg.r, "lora_alpha": peft_cfg.lora_alpha,
                    "task_type": str(getattr(peft_cfg.task_type, "value", peft_cfg.task_type)),
                    "target_modules": sorted(peft_cfg.target_modules) if isinstance(peft_cfg.target_modules, set)
                    else peft_cfg.target_modules}
            with open(os.path.join(path, "lora_train_meta.json"), "w") as f:
                json.dump(meta, f)
            lora_dir = os.path.join(path, "lora_adapter")
            peft_cfg.save_pretrained(lora_dir)
            weights = get_peft_model_state_dict(self.model, state_dict=adapter)
            save_torch_state_dict(own_storage(weights), lora_dir, filename_pattern="adapter_model{suffix}.safetensors")
        if full_state_dict is not None:
            save_torch_state_dict(own_storage(full_state_dict), hf_dir, max_shard_size=self.max_shard_size)

    # ------------------------------------------------------------------------------------------------ load
    def load_checkpoint(self, local_path: str | None, hdfs_path: str | None = None,
                        del_local_after_load: bool = False) -> None:
        if local_path is None:
            return
        local_path = os.path.abspath(os.path.expanduser(local_path))
        if not os.path.isdir(local_path):
            raise FileNotFoundError(f"checkpoint folder {local_path} does not exist (trainer.resume_from_path / "
                                    "default_local_dir/global_step_N/<role>)")
        if self.should_load_model:
            self._load_model(_RankFiles(local_path, "model", read_model_file, model_file))
        if self.should_load_optimizer:
            if any(n.startswith("optim_world_size_") for n in os.listdir(local_path)):
                self._load_optimizer(_RankFiles(local_path, "optim", read_optim_file, optim_file))
            else:
                print(f"{local_path} holds no optimizer state; the optimizer starts fresh")
        if self.should_load_extra:
            self._load_extra(local_path)
        barrier()
        if del_local_after_load and self.rank == 0:
            shutil.rmtree(local_path, ignore_errors=True)

    def _load_model(self, files: _RankFiles) -> None:
        same_world = files.world == self.world_size
        saved = files[self.rank if same_world else 0]
        own = self.model.state_dict()
        missing, unexpected = sorted(set(own) - set(saved)), sorted(set(saved) - set(own))
        if missing or unexpected:
            raise CheckpointFormatError(
                f"{files._paths[0]}: the checkpoint's model entries do not match this model: "
                f"{len(missing)} missing (e.g. {missing[:3]}), {len(unexpected)} not in the model "
                f"(e.g. {unexpected[:3]}); expected a checkpoint of the same architecture and LoRA setting")
        with torch.no_grad():
            for key, cur in own.items():
                dst = cur.to_local() if isinstance(cur, DTensor) else cur
                value = saved[key]
                if (same_world and isinstance(value, SavedShard) and isinstance(cur, DTensor)
                        and tuple(value.placements) == tuple(cur.placements) and value.local.shape == dst.shape):
                    src = value.local
                elif isinstance(value, SavedShard):
                    src = _place_like(full_tensor(key, [f[key] for f in files.all()]), cur)
                else:
                    src = _place_like(value, cur)
                src = src.to_local() if isinstance(src, DTensor) else src
                if tuple(src.shape) != tuple(dst.shape):
                    raise CheckpointFormatError(f"{key}: shape {tuple(src.shape)} in the checkpoint, "
                                                f"{tuple(dst.shape)} in this model")
                dst.copy_(src.to(dst.device, dst.dtype))

    def _load_optimizer(self, files: _RankFiles) -> None:
        same_world = files.world == self.world_size
        saved = files[self.rank if same_world else 0]
        params = _flat_params(self.optimizer)
        state = {}
        for idx, entry in saved["state"].items():
            if int(idx) >= len(params):
                raise CheckpointFormatError(f"{files._paths[0]} has optimizer state for parameter {idx} but this "
                                            f"optimizer has {len(params)} parameters; is it another model's?")
            p = params[int(idx)]
            state[idx] = {}
            for name, value in entry.items():
                if isinstance(value, tuple) and value[0] == "local":  # older wrapped files: this rank's piece
                    if not same_world:
                        raise CheckpointFormatError(
                            f"{files._paths[0]} is an older wrapped checkpoint saved by {files.world} ranks; its "
                            f"optimizer state can only be resumed by {files.world} ranks (here {self.world_size}). "
                            "Load it with load_contents=[model, extra] or resume with the saved number of ranks")
                    local = value[1].to(p.to_local().device if isinstance(p, DTensor) else p.device)
                    value = (DTensor.from_local(local, p.device_mesh, p.placements, run_check=False, shape=p.shape,
                                                stride=p.stride()) if isinstance(p, DTensor) else local)
                elif isinstance(value, SavedShard):
                    if (same_world and isinstance(p, DTensor) and tuple(value.placements) == tuple(p.placements)
                            and value.local.shape == p.to_local().shape):
                        value = DTensor.from_local(value.local.to(p.to_local().device), p.device_mesh, p.placements,
                                                   run_check=False, shape=p.shape, stride=p.stride())
                    else:
                        full = full_tensor(f"optimizer state {idx}.{name}", [f["state"][idx][name] for f in files.all()])
                        value = _place_like(full, p, value.local.dtype)
                elif isinstance(value, torch.Tensor) and isinstance(p, DTensor) and value.shape == p.shape \
                        and value.dim() > 0:  # saved unsharded, loaded sharded
                    value = _place_like(value, p, value.dtype)
                state[idx][name] = value
        self.optimizer.load_state_dict({"state": state, "param_groups": saved["param_groups"]})

    def _load_extra(self, local_path: str) -> None:
        if not any(n.startswith("extra_state_world_size_") for n in os.listdir(local_path)):
            return
        world = saved_world_size(local_path, "extra_state")
        extra = torch.load(os.path.join(local_path, extra_file(world, self.rank % world)), weights_only=False)
        if not isinstance(extra, dict):
            raise CheckpointFormatError(f"{local_path}: extra state is a {type(extra).__name__}; expected a dict "
                                        "with 'lr_scheduler' and 'rng'")
        if self.lr_scheduler is not None and extra.get("lr_scheduler") is not None:
            self.lr_scheduler.load_state_dict(extra["lr_scheduler"])
        if extra.get("rng") is not None:
            self.load_rng_state(extra["rng"])
