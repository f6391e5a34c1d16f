"""Forward passes with Ulysses sequence parallelism (see ``verl.utils.ulysses`` for the groups and collectives).

A micro-batch is packed (its valid tokens in one row), padded to a multiple of the sequence-parallel size and
cut into equal slices, one per rank of the group. The model runs on the slice with its own position ids; its
attention layers call :func:`ulysses_attention` (registered with transformers' ``AttentionInterface`` as
``"verl_ulysses"``), which all-to-alls query/key/value to whole-sequence, head-sharded tensors, attends with a
causal mask that keeps packed sequences apart, and all-to-alls back. Per-token results (log-probs, entropies,
values) are gathered over the group, differentiably, and unpacked to the engine's (B, R) convention.

The engine switches the model to this attention only inside :func:`ulysses_attention_active` (forward, loss and
backward of a micro-batch); elsewhere (e.g. generation with the same module) the model attends as before.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import repeat_kv

from verl.utils.padding import pack_batch, unpack_to_padded
from verl.utils.torch_functional import entropy_for_loss, logprobs_from_logits
from verl.utils.ulysses import gather_seq, head_to_seq, seq_to_head, slice_seq
from verl.workers.engine.hf_forward import token_values

__all__ = ["ATTENTION_NAME", "ulysses_attention", "ulysses_attention_active", "sp_forward_log_probs",
           "sp_forward_values"]

ATTENTION_NAME = "verl_ulysses"


class _Layout(threading.local):
    """The packed micro-batch being processed: the sp group and the (S, S) attention mask of the full sequence."""

    group = None
    mask = None


_LAYOUT = _Layout()


def ulysses_attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask=None, dropout: float = 0.0, scaling: float | None = None, **kwargs):
    """transformers attention function: (1, H, S/sp, D) local q/k/v -> (1, S/sp, H, D) local output."""
    group = _LAYOUT.group
    q, k, v = (seq_to_head(t, group) for t in (query, key, value))
    groups = getattr(module, "num_key_value_groups", 1)
    if groups > 1:  # kv heads were split like the query heads, so chunk r of each still matches
        k, v = repeat_kv(k, groups), repeat_kv(v, groups)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=_LAYOUT.mask,
                                         dropout_p=dropout if module.training else 0.0, scale=scaling)
    return head_to_seq(out, group).transpose(1, 2).contiguous(), None


AttentionInterface.register(ATTENTION_NAME, ulysses_attention)


def _configs(module: nn.Module):
    seen = []
    for sub in module.modules():
        cfg = getattr(sub, "config", None)
        if cfg is not None and hasattr(cfg, "_attn_implementation") and all(cfg is not c for c in seen):
            seen.append(cfg)
    return seen


@contextmanager
def ulysses_attention_active(module: nn.Module):
    """Within the block, every attention layer of ``module`` uses :func:`ulysses_attention` (nests)."""
    configs = _configs(module)
    before = [cfg._attn_implementation for cfg in configs]
    for cfg in configs:
        cfg._attn_implementation = ATTENTION_NAME
    try:
        yield
    finally:
        for cfg, impl in zip(configs, before):
            cfg._attn_implementation = impl


def _segment_mask(attention_mask: torch.Tensor, padded_len: int) -> torch.Tensor:
    """(S, S) boolean mask: causal within each packed sequence; the tail padding is a segment of its own."""
    counts = attention_mask.sum(-1)
    seg = torch.repeat_interleave(torch.arange(len(counts), device=counts.device), counts)
    seg = F.pad(seg, (0, padded_len - seg.numel()), value=len(counts))
    causal = torch.ones(padded_len, padded_len, dtype=torch.bool, device=seg.device).tril()
    return causal & (seg[:, None] == seg[None, :])


def _run_local(module: nn.Module, micro_batch, group):
    """Pack, pad, set the layout, run the model on this rank's slice; returns (model output, labels, meta)."""
    input_ids, attention_mask = micro_batch["input_ids"], micro_batch["attention_mask"]
    ids, pos, indices, _ = pack_batch(input_ids, attention_mask, micro_batch["position_ids"])
    total = ids.shape[-1]
    sp = torch.distributed.get_world_size(group)
    padded = total + (-total) % sp
    ids = F.pad(ids, (0, padded - total))
    pos = F.pad(pos, (0, padded - total))
    _LAYOUT.group, _LAYOUT.mask = group, _segment_mask(attention_mask, padded)
    output = module(input_ids=slice_seq(ids, group), position_ids=slice_seq(pos, group), attention_mask=None,
                    use_cache=False)
    labels = slice_seq(torch.roll(ids[0], shifts=-1), group, dim=0)  # wrap-around / cross-row labels are masked
    return output, labels, (indices, total)


def _to_response(values: torch.Tensor, meta, batch: int, seqlen: int, response_length: int, group) -> torch.Tensor:
    indices, total = meta
    full = gather_seq(values, group)[:total]
    return unpack_to_padded(full, indices, batch, seqlen)[:, -response_length - 1 : -1]


def sp_forward_log_probs(module: nn.Module, micro_batch, group, temperature: float = 1.0,
                         calculate_entropy: bool = False, entropy_grad: bool = True):
    """``(entropy, log_probs)`` of the response tokens, as ``hf_forward.forward_log_probs``, over the sp group."""
    batch, seqlen = micro_batch["input_ids"].shape
    response_length = micro_batch["responses"].shape[-1]
    output, labels, meta = _run_local(module, micro_batch, group)
    logits = output.logits[0] / temperature
    log_probs = _to_response(logprobs_from_logits(logits, labels), meta, batch, seqlen, response_length, group)
    entropy = None
    if calculate_entropy:
        ent = entropy_for_loss(logits, entropy_grad)
        entropy = _to_response(ent, meta, batch, seqlen, response_length, group)
    return entropy, log_probs.float()


def sp_forward_values(module: nn.Module, micro_batch, group) -> torch.Tensor:
    """Values (B, R) as ``hf_forward.forward_values``, over the sp group."""
    batch, seqlen = micro_batch["input_ids"].shape
    response_length = micro_batch["responses"].shape[-1]
    output, _, meta = _run_local(module, micro_batch, group)
    return _to_response(token_values(output)[0], meta, batch, seqlen, response_length, group).float()
