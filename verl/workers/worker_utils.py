"""Process-level helpers shared by the workers: joining the process group, device meshes, cross-rank timing
reductions, tokenizer loading."""

from __future__ import annotations

import datetime
import os

import torch
import torch.distributed as dist
from transformers import AutoTokenizer

from verl.single_controller.base.decorator import Dispatch, register
from verl.utils.device import collective_device, get_dist_backend, set_device
from verl.utils.fsdp_utils import create_device_mesh

__all__ = ["init_distributed", "build_device_mesh", "load_tokenizer", "max_across_ranks", "min_across_ranks",
           "same_tokenizer"]


def init_distributed(timeout_seconds: float | None = None) -> None:
    """Join the worker group's process group (env:// from RANK/WORLD_SIZE/MASTER_*) and bind the device.
    ``timeout_seconds`` (``actor_rollout_ref.nccl_timeout``): how long a collective may wait before it fails; None
    keeps torch's default. The first role of a process to join sets it (colocated roles share the group)."""
    if not dist.is_initialized():
        timeout = {} if timeout_seconds is None else {"timeout": datetime.timedelta(seconds=float(timeout_seconds))}
        dist.init_process_group(backend=get_dist_backend(), rank=int(os.environ.get("RANK", "0")),
                                world_size=int(os.environ.get("WORLD_SIZE", "1")), **timeout)
    set_device(int(os.environ.get("LOCAL_RANK", "0")))


def build_device_mesh(world_size: int, fsdp_size: int = -1):
    """1-D ``("fsdp",)`` mesh over all ranks, or 2-D ``("ddp", "fsdp")`` (HSDP) when ``fsdp_size`` divides it."""
    return create_device_mesh(world_size, fsdp_size)


def local_path(path: str) -> str:
    return os.path.abspath(os.path.expanduser(str(path)))


def load_tokenizer(path: str, trust_remote_code: bool = False, chat_template: str | None = None):
    """The tokenizer at ``path``; ``chat_template`` (``actor_rollout_ref.model.custom_chat_template``) replaces its
    own chat template, so the agent loops render their turns with it."""
    tokenizer = AutoTokenizer.from_pretrained(local_path(path), trust_remote_code=trust_remote_code)
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    return tokenizer


def _reduce(values: list[float], op) -> list[float]:
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return list(values)
    t = torch.tensor(values, dtype=torch.float64, device=collective_device())
    dist.all_reduce(t, op=op)
    return t.cpu().tolist()


def max_across_ranks(values: list[float]) -> list[float]:
    return _reduce(values, dist.ReduceOp.MAX)


def min_across_ranks(values: list[float]) -> list[float]:
    return _reduce(values, dist.ReduceOp.MIN)


def same_tokenizer(a, b) -> bool:
    return a.get_vocab() == b.get_vocab() and getattr(a, "chat_template", None) == getattr(b, "chat_template", None)


class EngineCheckpointMixin:
    """``save_checkpoint`` / ``load_checkpoint`` of a worker whose state is one training engine: the engine
    ``_checkpoint_engine()`` returns (default ``self.engine``) writes and reads its own checkpoint layout; every rank
    waits for the others; ``_after_checkpoint_load()`` runs last (e.g. a rollout must get the loaded weights)."""

    def _checkpoint_engine(self):
        return self.engine

    def _after_checkpoint_load(self) -> None:
        pass

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, local_path, hdfs_path=None, global_step=0, max_ckpt_to_keep=None):
        self._checkpoint_engine().save_checkpoint(local_path, global_step, max_ckpt_to_keep)
        dist.barrier()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, local_path, hdfs_path=None, del_local_after_load=False):
        self._checkpoint_engine().load_checkpoint(local_path, del_local_after_load)
        dist.barrier()
        self._after_checkpoint_load()
