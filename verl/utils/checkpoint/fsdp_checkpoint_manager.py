"""Sharded checkpoints of an FSDP2 model, its optimizer and scheduler, plus a Hugging Face side folder.

Layout of ``local_path`` (e.g. ``.../global_step_10/actor``), W = world size, r = rank::

    model_world_size_{W}_rank_{r}.pt        this rank's parameter shards (plain tensors) + how they were sharded
    optim_world_size_{W}_rank_{r}.pt        this rank's optimizer state (plain tensors)
    extra_state_world_size_{W}_rank_{r}.pt  lr scheduler state + RNG states (torch, numpy, random, device)
    fsdp_config.json                        {"FSDP_version": 2, "world_size": W}
    lora_train_meta.json                    {"r", "lora_alpha", ...} for a peft LoRA model
    huggingface/                            config.json, generation_config.json, tokenizer files
                                            (+ model.safetensors with full, LoRA-merged weights for "hf_model")

Shards are stored as plain local tensors with their DTensor placement, so ``verl.model_merger`` can rebuild the
full weights without a process group. Everything is written to ``<local_path>.tmp`` first and renamed when every
rank is done: a crash never leaves a half-written ``local_path``. Resuming needs the same world size (to change
it, merge to HF with ``python -m verl.model_merger`` and start from that model).
"""

from __future__ import annotations

import copy
import json
import os
import shutil

import torch
from torch.distributed.tensor import DTensor, Replicate, Shard

from verl.utils.checkpoint.checkpoint_manager import BaseCheckpointManager, barrier
from verl.utils.fsdp_utils import get_full_state_dict, is_peft_model
from verl.utils.model import unwrap_peft

FORMAT = "verl-fsdp2-local-shards-v1"


def model_file(world_size: int, rank: int) -> str:
    return f"model_world_size_{world_size}_rank_{rank}.pt"


def optim_file(world_size: int, rank: int) -> str:
    return f"optim_world_size_{world_size}_rank_{rank}.pt"


def extra_file(world_size: int, rank: int) -> str:
    return f"extra_state_world_size_{world_size}_rank_{rank}.pt"


def _placements(t: DTensor) -> list:
    out = []
    for p in t.placements:
        if isinstance(p, Shard):
            out.append(["shard", p.dim])
        elif isinstance(p, Replicate):
            out.append(["replicate"])
        else:
            raise NotImplementedError(f"cannot checkpoint DTensor placement {p}")
    return out


def _local_model_state(model) -> dict:
    tensors, meta = {}, {}
    for key, value in model.state_dict().items():
        if isinstance(value, DTensor):
            tensors[key] = value.to_local().detach().cpu().clone()
            meta[key] = {"shape": list(value.shape), "placements": _placements(value),
                         "mesh_shape": list(value.device_mesh.shape),
                         "coordinate": list(value.device_mesh.get_coordinate() or [])}
        else:
            tensors[key] = value.detach().cpu().clone()
    return {"format": FORMAT, "state_dict": tensors, "dtensor": meta}


def _flat_params(optimizer) -> list:
    return [p for group in optimizer.param_groups for p in group["params"]]


def _local_optim_state(optimizer) -> dict:
    sd = optimizer.state_dict()
    dtensor_keys = []
    state = {}
    for idx, entry in sd["state"].items():
        state[idx] = {}
        for k, v in entry.items():
            if isinstance(v, DTensor):
                dtensor_keys.append([idx, k])
                v = v.to_local()
            state[idx][k] = v.detach().cpu().clone() if isinstance(v, torch.Tensor) else v
    return {"format": FORMAT, "state_dict": {"state": state, "param_groups": sd["param_groups"]},
            "dtensor_keys": dtensor_keys}


class FSDPCheckpointManager(BaseCheckpointManager):
    """``save_checkpoint`` / ``load_checkpoint`` for an FSDP2 (or unsharded) model, optimizer and lr scheduler.

    ``processing_class`` (a tokenizer or processor) is saved under ``huggingface/``; ``checkpoint_config`` is
    the role's ``checkpoint`` node (``save_contents``, ``load_contents``).
    """

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
            torch.save(_local_model_state(self.model), os.path.join(tmp, model_file(W, r)))
        if self.should_save_optimizer:
            torch.save(_local_optim_state(self.optimizer), os.path.join(tmp, optim_file(W, r)))
        if self.should_save_extra:
            extra = {"lr_scheduler": self.lr_scheduler.state_dict() if self.lr_scheduler is not None else None,
                     "rng": self.get_rng_state(), "global_step": global_step}
            torch.save(extra, os.path.join(tmp, extra_file(W, r)))
        full = get_full_state_dict(self.model, rank0_only=True) if self.should_save_hf_model else None
        if r == 0:
            self._save_hf_side(tmp, full)
            with open(os.path.join(tmp, "fsdp_config.json"), "w") as f:
                json.dump({"FSDP_version": 2, "world_size": W, "format": FORMAT, "global_step": global_step}, f)
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

    def _save_hf_side(self, path: str, full_state_dict: dict | None) -> None:
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
            except Exception:  # an invalid generation config must not block the checkpoint
                pass
        if self.processing_class is not None:
            self.processing_class.save_pretrained(hf_dir)
        if is_peft_model(self.model):
            peft_cfg = self.model.peft_config[self.model.active_adapter]
            meta = {"r": peft_cfg.r, "lora_alpha": peft_cfg.lora_alpha,
                    "task_type": str(getattr(peft_cfg.task_type, "value", peft_cfg.task_type)),
                    "target_modules": sorted(peft_cfg.target_modules) if isinstance(peft_cfg.target_modules, set)
                    else peft_cfg.target_modules}
            with open(os.path.join(path, "lora_train_meta.json"), "w") as f:
                json.dump(meta, f)
        if full_state_dict is not None:
            from safetensors.torch import save_file

            save_file({k: v.contiguous() for k, v in full_state_dict.items()}, os.path.join(hf_dir, "model.safetensors"),
                      metadata={"format": "pt"})

    # ------------------------------------------------------------------------------------------------ load
    def load_checkpoint(self, local_path: str | None, hdfs_path: str | None = None,
                        del_local_after_load: bool = False) -> None:
        if local_path is None:
            return
        local_path = os.path.abspath(os.path.expanduser(local_path))
        if not os.path.isdir(local_path):
            raise FileNotFoundError(f"checkpoint folder {local_path} does not exist (trainer.resume_from_path / "
                                    "default_local_dir/global_step_N/<role>)")
        W, r = self.world_size, self.rank
        cfg_path = os.path.join(local_path, "fsdp_config.json")
        if os.path.exists(cfg_path):
            with open(cfg_path) as f:
                saved_world = json.load(f).get("world_size", W)
            if saved_world != W:
                raise ValueError(
                    f"checkpoint {local_path} was saved by {saved_world} ranks but {W} ranks are loading it; resume "
                    f"with {saved_world} ranks, or merge it to an HF model (python -m verl.model_merger merge "
                    f"--backend fsdp --local_dir {local_path} --target_dir <dir>) and start from that model")
        if self.should_load_model:
            self._load_model(torch.load(os.path.join(local_path, model_file(W, r)), weights_only=False))
        if self.should_load_optimizer:
            p = os.path.join(local_path, optim_file(W, r))
            if os.path.exists(p):
                self._load_optimizer(torch.load(p, weights_only=False))
        if self.should_load_extra:
            p = os.path.join(local_path, extra_file(W, r))
            if os.path.exists(p):
                extra = torch.load(p, weights_only=False)
                if self.lr_scheduler is not None and extra.get("lr_scheduler") is not None:
                    self.lr_scheduler.load_state_dict(extra["lr_scheduler"])
                if extra.get("rng") is not None:
                    self.load_rng_state(extra["rng"])
        barrier()
        if del_local_after_load and r == 0:
            shutil.rmtree(local_path, ignore_errors=True)

    def _load_model(self, saved: dict) -> None:
        tensors = saved["state_dict"]
        own = self.model.state_dict()
        missing = sorted(set(own) - set(tensors))
        if missing:
            raise KeyError(f"checkpoint lacks {len(missing)} model tensors, e.g. {missing[:3]}; was it saved from "
                           "the same model (and the same LoRA setting)?")
        with torch.no_grad():
            for key, cur in own.items():
                dst = cur.to_local() if isinstance(cur, DTensor) else cur
                src = tensors[key]
                if tuple(src.shape) != tuple(dst.shape):
                    raise ValueError(f"shard of {key} has shape {tuple(src.shape)} in the checkpoint but "
                                     f"{tuple(dst.shape)} here: the sharding (world size / fsdp_size) changed")
                dst.copy_(src.to(dst.device, dst.dtype))

    def _load_optimizer(self, saved: dict) -> None:
        sd = saved["state_dict"]
        params = _flat_params(self.optimizer)
        for idx, key in saved.get("dtensor_keys", []):
            p = params[idx]
            local = sd["state"][idx][key].to(p.to_local().device if isinstance(p, DTensor) else p.device)
            if isinstance(p, DTensor):
                sd["state"][idx][key] = DTensor.from_local(local, p.device_mesh, p.placements, run_check=False,
                                                           shape=p.shape, stride=p.stride())
        self.optimizer.load_state_dict(sd)
