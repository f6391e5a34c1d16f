"""Process-level helpers shared by the FSDP workers: joining the process group, device meshes, cross-rank
timing reductions, optimizer/scheduler and checkpoint-manager construction, tokenizer loading."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from verl.utils.device import collective_device, get_dist_backend, set_device
from verl.workers.rollout.utils import cfg_get

__all__ = ["init_distributed", "build_device_mesh", "load_tokenizer", "max_across_ranks", "min_across_ranks",
           "wrap_fsdp", "build_optimizer_and_scheduler", "current_lr", "make_checkpoint_manager",
           "load_checkpoint_with", "same_tokenizer"]


def init_distributed() -> None:
    """Join the worker group's process group (env:// from RANK/WORLD_SIZE/MASTER_*) and bind the device."""
    if not dist.is_initialized():
        dist.init_process_group(backend=get_dist_backend(), rank=int(os.environ.get("RANK", "0")),
                                world_size=int(os.environ.get("WORLD_SIZE", "1")))
    set_device(int(os.environ.get("LOCAL_RANK", "0")))


def build_device_mesh(world_size: int, fsdp_size: int = -1):
    """1-D ``("fsdp",)`` mesh over all ranks, or 2-D ``("ddp", "fsdp")`` (HSDP) when ``fsdp_size`` divides it."""
    from verl.utils.fsdp_utils import create_device_mesh

    return create_device_mesh(world_size, fsdp_size)


def local_path(path: str) -> str:
    return os.path.abspath(os.path.expanduser(str(path)))


def load_tokenizer(path: str, trust_remote_code: bool = False):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(local_path(path), trust_remote_code=trust_remote_code)


def max_across_ranks(values: list[float]) -> list[float]:
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return list(values)
    t = torch.tensor(values, dtype=torch.float64, device=collective_device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.cpu().tolist()


def min_across_ranks(values: list[float]) -> list[float]:
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return list(values)
    t = torch.tensor(values, dtype=torch.float64, device=collective_device())
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return t.cpu().tolist()


def wrap_fsdp(module, fsdp_config, device_mesh):
    from verl.utils import fsdp_utils

    return fsdp_utils.apply_fsdp2(module, fsdp_config, device_mesh)


def build_optimizer_and_scheduler(module, optim_config):
    from verl.utils import fsdp_utils

    total_steps = int(cfg_get(optim_config, "total_training_steps", -1))
    optimizer = fsdp_utils.build_optimizer(module.parameters(), optim_config)
    scheduler = fsdp_utils.build_lr_scheduler(optimizer, optim_config, total_steps)
    return optimizer, scheduler


def current_lr(scheduler, optimizer) -> float:
    if scheduler is not None and hasattr(scheduler, "get_last_lr"):
        return float(scheduler.get_last_lr()[0])
    return float(optimizer.param_groups[0]["lr"])


def make_checkpoint_manager(model, optimizer, scheduler, tokenizer, checkpoint_config):
    from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager

    try:
        return FSDPCheckpointManager(model=model, optimizer=optimizer, lr_scheduler=scheduler,
                                     processing_class=tokenizer, checkpoint_config=checkpoint_config)
    except TypeError:  # an engine without the checkpoint_config keyword
        return FSDPCheckpointManager(model=model, optimizer=optimizer, lr_scheduler=scheduler,
                                     processing_class=tokenizer)


def load_checkpoint_with(manager, local_path, del_local_after_load):
    try:
        manager.load_checkpoint(local_path=local_path, del_local_after_load=del_local_after_load)
    except TypeError:  # an engine without del_local_after_load
        manager.load_checkpoint(local_path=local_path)
        if del_local_after_load and local_path and os.path.isdir(local_path) and dist.get_rank() == 0:
            import shutil

            shutil.rmtree(local_path, ignore_errors=True)


def same_tokenizer(a, b) -> bool:
    return a.get_vocab() == b.get_vocab() and getattr(a, "chat_template", None) == getattr(b, "chat_template", None)
