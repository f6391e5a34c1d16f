"""Ulysses sequence parallelism: process groups and the differentiable collectives it needs.

With ``ulysses_sequence_parallel_size = sp``, consecutive ranks ``[g*sp, (g+1)*sp)`` form a sequence-parallel
group that works on the *same* micro-batch: each rank holds ``1/sp`` of the (packed) sequence. Everything but
attention is per token, so it runs on the local slice; around attention an all-to-all turns the
sequence-sharded ``(B, H, S/sp, D)`` query/key/value into head-sharded ``(B, H/sp, S, D)`` (every rank sees the
whole sequence for its heads) and back. Ranks holding the same slot of their group form a data-parallel group
(size ``world/sp``): each data-parallel group counts its data once.

All collectives work over gloo (CPU) as over nccl.
"""

from __future__ import annotations

from dataclasses import dataclass

import os

import torch
import torch.distributed as dist

from verl.utils.config import ConfigError

__all__ = ["UlyssesGroups", "init_ulysses_groups", "seq_to_head", "head_to_seq", "gather_seq", "slice_seq",
           "check_ulysses_size", "check_ulysses_config"]


@dataclass(frozen=True)
class UlyssesGroups:
    """This rank's sequence-parallel group (``sp_group``, ``sp_rank`` of ``sp_size``) and data-parallel group
    (``dp_group``, ``dp_rank`` of ``dp_size``)."""

    sp_group: object
    dp_group: object
    sp_size: int
    sp_rank: int
    dp_size: int
    dp_rank: int


def check_ulysses_size(sp_size: int, world_size: int, num_heads: int | None = None,
                       num_kv_heads: int | None = None, key: str = "ulysses_sequence_parallel_size") -> None:
    """Raise ``ValueError`` naming ``key`` unless ``sp_size`` divides the world size and the head counts."""
    if sp_size < 1:
        raise ValueError(f"{key}={sp_size} must be >= 1")
    if world_size % sp_size:
        raise ValueError(f"{key}={sp_size} must divide the number of processes ({world_size}); "
                         f"use a divisor of {world_size}")
    for what, n in (("attention heads", num_heads), ("key/value heads", num_kv_heads)):
        if n is not None and n % sp_size:
            raise ValueError(f"{key}={sp_size} must divide the model's number of {what} ({n}): each rank "
                             f"attends with {n}/{key} heads; use a divisor of {n}")


def _model_heads(path) -> tuple[int | None, int | None]:
    path = os.path.expanduser(str(path))
    if not os.path.isdir(path):
        return None, None  # a hub id or missing directory: the model-path check reports it
    from transformers import AutoConfig  # here: config validation on the driver does not load transformers

    cfg = AutoConfig.from_pretrained(path)
    cfg = getattr(cfg, "text_config", None) or cfg
    heads = getattr(cfg, "num_attention_heads", None)
    return heads, getattr(cfg, "num_key_value_heads", None) or heads


def check_ulysses_config(config, n_gpus: int, use_critic: bool, check_files: bool = True) -> None:
    """Before workers start: ``ulysses_sequence_parallel_size`` of the actor (the reference follows it) and the
    critic must divide the number of processes and the model's heads, run on the FSDP engine and come with
    ``use_remove_padding``. ``config`` is the typed PPO config (``PPOPlan.config``: every key present, with the
    schema's defaults). Raises ``ConfigError`` naming the key."""
    ar = config.actor_rollout_ref
    actor_sp, ref_sp = ar.actor.ulysses_sequence_parallel_size, ar.ref.ulysses_sequence_parallel_size
    if ref_sp != actor_sp:
        raise ConfigError(f"actor_rollout_ref.ref.ulysses_sequence_parallel_size={ref_sp} differs from "
                          f"actor_rollout_ref.actor.ulysses_sequence_parallel_size={actor_sp}: the reference runs in "
                          "the actor's processes with the actor's groups; leave it unset (it follows the actor)")
    # (role prefix, its model's prefix, the role section, whether its sequences are packed, the model path)
    roles = [("actor_rollout_ref.actor", "actor_rollout_ref.model", ar.actor, ar.actor.use_remove_padding,
              ar.model.path)]
    if use_critic:
        critic = config.critic
        roles.append(("critic", "critic.model", critic, critic.model.use_remove_padding, critic.model.path))
    for prefix, model, role, remove_padding, path in roles:
        key = f"{prefix}.ulysses_sequence_parallel_size"
        sp = int(role.ulysses_sequence_parallel_size)
        if sp == 1:
            continue
        if role.strategy not in ("fsdp", "fsdp2"):
            raise ConfigError(f"{key}={sp} needs {prefix}.strategy=fsdp or fsdp2 (got {role.strategy!r}); the "
                              f"Megatron engine splits sequences its own way; set {key}=1")
        if not remove_padding:
            raise ConfigError(f"{key}={sp} needs {model}.use_remove_padding=True: the packed sequence (padding "
                              "removed) is what is split across ranks")
        heads = kv_heads = None
        if check_files:
            heads, kv_heads = _model_heads(path)
        try:
            check_ulysses_size(sp, n_gpus, heads, kv_heads, key=key)
        except ValueError as err:
            raise ConfigError(str(err)) from None


def init_ulysses_groups(sp_size: int) -> UlyssesGroups:
    """Create the sequence- and data-parallel groups over all ranks (a collective: every rank calls it)."""
    world, rank = dist.get_world_size(), dist.get_rank()
    check_ulysses_size(sp_size, world)
    sp_group = dp_group = None
    for g in range(world // sp_size):  # every rank must create every group, in the same order
        group = dist.new_group(list(range(g * sp_size, (g + 1) * sp_size)))
        if rank // sp_size == g:
            sp_group = group
    for slot in range(sp_size):
        group = dist.new_group(list(range(slot, world, sp_size)))
        if rank % sp_size == slot:
            dp_group = group
    return UlyssesGroups(sp_group, dp_group, sp_size, rank % sp_size, world // sp_size, rank // sp_size)


def _all_to_all(x: torch.Tensor, group) -> torch.Tensor:
    x = x.contiguous()  # the split is along dim 0 of the memory layout
    out = torch.empty_like(x)
    dist.all_to_all_single(out, x, group=group)
    return out


def _seq_to_head(x: torch.Tensor, group) -> torch.Tensor:
    sp = dist.get_world_size(group)
    b, h, s, d = x.shape
    # chunk j of the heads goes to rank j; from rank i come its s tokens of our heads
    parts = x.reshape(b, sp, h // sp, s, d).permute(1, 0, 2, 3, 4)
    got = _all_to_all(parts, group)  # (sp, b, h/sp, s, d), index = source rank = sequence position of the slice
    return got.permute(1, 2, 0, 3, 4).reshape(b, h // sp, sp * s, d)


def _head_to_seq(x: torch.Tensor, group) -> torch.Tensor:
    sp = dist.get_world_size(group)
    b, hl, s_full, d = x.shape
    s = s_full // sp
    parts = x.reshape(b, hl, sp, s, d).permute(2, 0, 1, 3, 4)  # slice j of the sequence goes to rank j
    got = _all_to_all(parts, group)  # (sp, b, h/sp, s, d), index = source rank = head chunk
    return got.permute(1, 0, 2, 3, 4).reshape(b, sp * hl, s, d)


class _SeqToHead(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _seq_to_head(x, group)

    @staticmethod
    def backward(ctx, grad):
        return _head_to_seq(grad, ctx.group), None


class _HeadToSeq(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _head_to_seq(x, group)

    @staticmethod
    def backward(ctx, grad):
        return _seq_to_head(grad, ctx.group), None


def seq_to_head(x: torch.Tensor, group) -> torch.Tensor:
    """(B, H, S/sp, D) sequence-sharded -> (B, H/sp, S, D) head-sharded (differentiable all-to-all)."""
    return _SeqToHead.apply(x, group)


def head_to_seq(x: torch.Tensor, group) -> torch.Tensor:
    """(B, H/sp, S, D) head-sharded -> (B, H, S/sp, D) sequence-sharded (differentiable all-to-all)."""
    return _HeadToSeq.apply(x, group)


class _GatherSeq(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, grad_scale):
        ctx.group, ctx.grad_scale = group, grad_scale
        sp = dist.get_world_size(group)
        out = torch.empty((sp * x.shape[0], *x.shape[1:]), dtype=x.dtype, device=x.device)
        dist.all_gather_into_tensor(out, x.contiguous(), group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        rank, n = dist.get_rank(ctx.group), grad.shape[0] // dist.get_world_size(ctx.group)
        return grad[rank * n : (rank + 1) * n] * ctx.grad_scale, None, None


def gather_seq(x: torch.Tensor, group, grad_scale: float | None = None) -> torch.Tensor:
    """Concatenate every rank's slice along dim 0, differentiably.

    Every rank of the group computes the same loss from the gathered tensor, so the backward needs no
    communication: each rank keeps the gradient of its own slice. ``grad_scale`` (default: the group size)
    multiplies it so that, after the usual gradient *average* over all ``dp * sp`` ranks, each data-parallel
    group's loss counts once, as without sequence parallelism.
    """
    scale = float(dist.get_world_size(group)) if grad_scale is None else float(grad_scale)
    return _GatherSeq.apply(x, group, scale)


def slice_seq(x: torch.Tensor, group, dim: int = -1) -> torch.Tensor:
    """This rank's equal slice of ``x`` along ``dim`` (the length must divide by the group size)."""
    sp, rank = dist.get_world_size(group), dist.get_rank(group)
    n = x.shape[dim] // sp
    return x.narrow(dim, rank * n, n)
