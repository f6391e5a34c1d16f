"""Small tensor helpers shared by the trainer, the workers and the algorithms.

Everything here is a pure function of its inputs (no globals, no device branching). Masks are 0/1 tensors
(bool, int or float) broadcastable to the values they select; "masked" statistics ignore every position where
the mask is 0, including NaNs stored there.
"""

from __future__ import annotations

import contextlib
from contextvars import ContextVar

import math
from typing import Optional, Sequence, Union

import torch
import torch.distributed as dist
import torch.utils.checkpoint
import torch.nn.functional as F

__all__ = [
    "masked_sum",
    "masked_mean",
    "masked_var",
    "masked_whiten",
    "logprobs_from_logits",
    "logprobs_from_logits_naive",
    "entropy_from_logits",
    "entropy_from_logits_with_chunking",
    "clip_by_value",
    "pad_sequence_to_length",
    "pad_2d_list_to_length",
    "get_response_mask",
    "get_eos_mask",
    "postprocess_data",
    "get_constant_schedule_with_warmup",
    "get_cosine_schedule_with_warmup",
    "gather_from_labels",
    "compute_grad_norm",
    "allgather_dict_tensors",
    "split_dict_tensor_into_batches",
    "remove_pad_token",
    "tokenize_and_postprocess_data",
]


# --------------------------------------------------------------------------------------------------------------
# masked statistics
# --------------------------------------------------------------------------------------------------------------
def masked_sum(values: torch.Tensor, mask: torch.Tensor, axis: Optional[int] = None) -> torch.Tensor:
    """Sum of ``values`` where ``mask`` is non-zero (NaN/inf at masked-out positions do not leak in)."""
    mask = mask.to(values.dtype) if values.is_floating_point() else mask
    kept = torch.where(mask.bool(), values, torch.zeros((), dtype=values.dtype, device=values.device))
    return (kept * mask).sum() if axis is None else (kept * mask).sum(dim=axis)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, axis: Optional[int] = None) -> torch.Tensor:
    """Mean of ``values`` over positions where ``mask`` is non-zero; an all-zero mask gives 0."""
    count = mask.sum() if axis is None else mask.sum(dim=axis)
    return masked_sum(values, mask, axis) / (count + 1e-8)


def masked_var(values: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of ``values`` over the masked positions (Bessel-corrected when ``unbiased``)."""
    mean = masked_mean(values, mask)
    var = masked_mean((values - mean) ** 2, mask)
    if unbiased:
        n = float(mask.sum().item())
        if n == 0:
            raise ValueError("masked_var: the mask selects no element; at least 2 are needed for an unbiased variance")
        if n == 1:
            raise ValueError(
                "masked_var: the mask selects a single element, so the unbiased variance divides by zero; "
                "pass unbiased=False or a mask with at least 2 elements"
            )
        var = var * (n / (n - 1))
    return var


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True) -> torch.Tensor:
    """(values - mean) / sqrt(var + 1e-8) with masked mean/unbiased variance; keeps the mean if not shift_mean."""
    mean, var = masked_mean(values, mask), masked_var(values, mask)
    whitened = (values - mean) * torch.rsqrt(var + 1e-8)
    return whitened if shift_mean else whitened + mean


# --------------------------------------------------------------------------------------------------------------
# log-probabilities and entropy
# --------------------------------------------------------------------------------------------------------------
def logprobs_from_logits_naive(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[label] computed with a full log_softmax (simple reference implementation)."""
    return torch.gather(F.log_softmax(logits, dim=-1), -1, labels.unsqueeze(-1)).squeeze(-1)


def logprobs_from_logits(logits: torch.Tensor, labels: torch.Tensor, inplace_backward: bool = True) -> torch.Tensor:
    """Log-probability of ``labels`` (shape ``(...)``) under ``logits`` (shape ``(..., V)``).

    For fp32/fp64 this is ``logit[label] - logsumexp(logits)`` which never materialises a second (..., V)
    tensor; low-precision logits are upcast row-block by row-block to fp32 first for accuracy.
    ``inplace_backward`` is accepted for verl compatibility (a fused-kernel option) and has no effect here.
    """
    del inplace_backward
    if logits.dtype in (torch.float32, torch.float64):
        picked = torch.gather(logits, -1, labels.unsqueeze(-1)).squeeze(-1)
        return picked - torch.logsumexp(logits, dim=-1)
    flat_logits = logits.reshape(-1, logits.shape[-1])
    flat_labels = labels.reshape(-1)
    out = torch.empty(flat_labels.shape, dtype=logits.dtype, device=logits.device)
    block = 1024
    for start in range(0, flat_logits.shape[0], block):
        rows = flat_logits[start : start + block].float()
        lab = flat_labels[start : start + block]
        out[start : start + block] = (rows.gather(-1, lab.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(rows, -1)).to(
            logits.dtype
        )
    return out.reshape(labels.shape)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy H(softmax(logits)) over the last dim: logsumexp(z) - sum_v p_v z_v."""
    probs = F.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (probs * logits).sum(dim=-1)


CHECKPOINT_ENTROPY = "checkpoint"  # entropy_grad value of actor.entropy_checkpointing=True


def _fp32_entropy(logits: torch.Tensor) -> torch.Tensor:
    return entropy_from_logits(logits if logits.dtype == torch.float32 else logits.float())


ENTROPY_CHUNK_ROWS = 2048  # rows per chunk with <role>.entropy_from_logits_with_chunking (verl's chunk size)
_entropy_chunk_rows: ContextVar[int] = ContextVar("entropy_chunk_rows", default=0)


@contextlib.contextmanager
def entropy_chunking(rows: int):
    """Within the block, :func:`entropy_for_loss` works on ``rows`` logit rows at a time (0: all at once): the
    float32 copy of the logits and the softmax over the vocabulary exist for one chunk at a time (same values)."""
    token = _entropy_chunk_rows.set(int(rows))
    try:
        yield
    finally:
        _entropy_chunk_rows.reset(token)


def entropy_for_loss(logits: torch.Tensor, entropy_grad=True) -> torch.Tensor:
    """See :func:`_entropy_for_loss`; inside :func:`entropy_chunking` it runs on chunks of rows."""
    rows = _entropy_chunk_rows.get()
    if rows <= 0 or logits.dim() < 2 or logits.shape[:-1].numel() <= rows:
        return _entropy_for_loss(logits, entropy_grad)
    flat = logits.reshape(-1, logits.shape[-1])
    parts = [_entropy_for_loss(flat[i : i + rows], entropy_grad) for i in range(0, flat.shape[0], rows)]
    return torch.cat(parts).reshape(logits.shape[:-1])


def _entropy_for_loss(logits: torch.Tensor, entropy_grad=True) -> torch.Tensor:
    """:func:`entropy_from_logits` in float32, as a loss term or a metric. ``entropy_grad``: False computes it from
    detached logits (a metric: no graph kept); True keeps it differentiable; ``"checkpoint"``
    (``actor.entropy_checkpointing``) keeps it differentiable but recomputes the float32 softmax over the
    vocabulary in backward instead of holding it (same values and gradients, less memory)."""
    if not entropy_grad:
        return _fp32_entropy(logits.detach())
    if entropy_grad == CHECKPOINT_ENTROPY and torch.is_grad_enabled() and logits.requires_grad:
        return torch.utils.checkpoint.checkpoint(_fp32_entropy, logits, use_reentrant=False,
                                                 preserve_rng_state=False)
    return _fp32_entropy(logits)


def entropy_from_logits_with_chunking(logits: torch.Tensor, chunk_size: int = 2048) -> torch.Tensor:
    """Same as :func:`entropy_from_logits` for ``(N, V)`` logits, computed ``chunk_size`` rows at a time in fp32."""
    out = torch.zeros(logits.shape[:-1], dtype=logits.dtype, device=logits.device)
    for start in range(0, logits.shape[0], chunk_size):
        out[start : start + chunk_size] = entropy_from_logits(logits[start : start + chunk_size].float()).to(out.dtype)
    return out


def clip_by_value(x: torch.Tensor, tensor_min, tensor_max) -> torch.Tensor:
    """Element-wise clamp of ``x`` to [tensor_min, tensor_max] (bounds may be tensors)."""
    return torch.max(torch.min(x, torch.as_tensor(tensor_max, dtype=x.dtype, device=x.device)),
                     torch.as_tensor(tensor_min, dtype=x.dtype, device=x.device))


# --------------------------------------------------------------------------------------------------------------
# padding and masks
# --------------------------------------------------------------------------------------------------------------
def pad_sequence_to_length(tensors: torch.Tensor, max_seq_len: int, pad_token_id, left_pad: bool = False) -> torch.Tensor:
    """Pad the last dim of ``tensors`` to ``max_seq_len`` with ``pad_token_id`` (no-op if already that long)."""
    missing = max_seq_len - tensors.shape[-1]
    if missing <= 0:
        return tensors
    return F.pad(tensors, (missing, 0) if left_pad else (0, missing), value=pad_token_id)


def pad_2d_list_to_length(response: Sequence[Sequence[int]], pad_token_id, max_length: Optional[int] = None) -> torch.Tensor:
    """Right-pad a list of token lists into a (N, max(max_length, longest)) tensor."""
    longest = max((len(r) for r in response), default=0)
    width = longest if max_length is None else max(max_length, longest)
    rows = [list(r) + [pad_token_id] * (width - len(r)) for r in response]
    return torch.tensor(rows)


def get_response_mask(response_id: torch.Tensor, eos_token: Union[int, Sequence[int]] = 2, dtype=torch.int64) -> torch.Tensor:
    """1 for every response token up to and including the first EOS, 0 after it.

    ``eos_token`` may be one id or a list of ids. Example: ``[5, 7, EOS, 0, 0] -> [1, 1, 1, 0, 0]``.
    """
    eos_ids = torch.as_tensor(eos_token, device=response_id.device).reshape(-1)
    is_eos = torch.isin(response_id, eos_ids).long()
    eos_before = is_eos.cumsum(dim=-1) - is_eos  # number of EOS strictly before each position
    return (eos_before == 0).to(dtype)


get_eos_mask = get_response_mask  # older verl name


def postprocess_data(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    max_length: int,
    pad_token_id: int,
    left_pad: bool = True,
    truncation: str = "error",
):
    """Pad or truncate (1, L) prompt tensors to ``max_length``.

    ``truncation``: ``left`` keeps the last tokens, ``right`` keeps the first, ``middle`` keeps both ends,
    ``error`` raises (verl's modes).
    """
    assert truncation in ("left", "right", "middle", "error"), f"unknown truncation {truncation!r}"
    length = input_ids.shape[-1]
    if length < max_length:
        input_ids = pad_sequence_to_length(input_ids, max_length, pad_token_id, left_pad=left_pad)
        attention_mask = pad_sequence_to_length(attention_mask, max_length, 0, left_pad=left_pad)
    elif length > max_length:
        if truncation == "left":
            input_ids, attention_mask = input_ids[..., -max_length:], attention_mask[..., -max_length:]
        elif truncation == "right":
            input_ids, attention_mask = input_ids[..., :max_length], attention_mask[..., :max_length]
        elif truncation == "middle":
            head = max_length // 2
            tail = max_length - head
            input_ids = torch.cat([input_ids[..., :head], input_ids[..., length - tail :]], dim=-1)
            attention_mask = torch.cat([attention_mask[..., :head], attention_mask[..., length - tail :]], dim=-1)
        else:
            raise NotImplementedError(
                f"input length {length} is longer than max_length={max_length}; set data.truncation to "
                "left|right|middle, raise data.max_prompt_length, or set data.filter_overlong_prompts=True"
            )
    return input_ids, attention_mask


# --------------------------------------------------------------------------------------------------------------
# learning-rate schedules (LambdaLR factories)
# --------------------------------------------------------------------------------------------------------------
def get_constant_schedule_with_warmup(optimizer, num_warmup_steps: int, last_epoch: int = -1):
    """Linear warm-up from 0 to the base lr over ``num_warmup_steps``, then constant."""

    def factor(step: int) -> float:
        # No warm-up means full lr from the very first step (not 0/1 = 0 at step 0).
        if step < num_warmup_steps:
            return float(step) / float(num_warmup_steps)
        return 1.0

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor, last_epoch)


def get_cosine_schedule_with_warmup(
    optimizer,
    num_warmup_steps: int,
    num_training_steps: int,
    min_lr_ratio: float = 0.0,
    num_cycles: float = 0.5,
    last_epoch: int = -1,
):
    """Linear warm-up, then cosine decay from the base lr down to ``min_lr_ratio`` * base lr."""
    assert 0.0 <= min_lr_ratio <= 1.0, "min_lr_ratio must be in [0, 1]"

    def factor(step: int) -> float:
        if step < num_warmup_steps:
            return float(step) / float(max(1, num_warmup_steps))
        progress = float(step - num_warmup_steps) / float(max(1, num_training_steps - num_warmup_steps))
        cosine = 0.5 * (1.0 + math.cos(math.pi * 2.0 * num_cycles * progress))
        return min_lr_ratio + (1.0 - min_lr_ratio) * max(0.0, cosine)

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor, last_epoch)


# --------------------------------------------------------------------------------------------------------------
# smaller verl helpers that research code imports from here
# --------------------------------------------------------------------------------------------------------------
def gather_from_labels(data: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
    """``data[..., label]`` per position: (..., V) values and (...) indices -> (...)."""
    return torch.gather(data, -1, label.unsqueeze(-1)).squeeze(-1)


def compute_grad_norm(model: torch.nn.Module) -> float:
    """verl's definition: the sum of squared gradient entries over all parameters that have a gradient
    (the squared L2 norm; take ``math.sqrt`` for the norm itself)."""
    return sum(float(p.grad.detach().float().square().sum()) for p in model.parameters() if p.grad is not None)


def allgather_dict_tensors(tensors, size: int, group, dim: int = 0):
    """All-gather every tensor of a dict / TensorDict over ``group`` (``size`` ranks) and concatenate on ``dim``;
    returns the same container type (a TensorDict's batch size grows ``size`` times)."""
    is_td = hasattr(tensors, "to_dict") and hasattr(tensors, "batch_size")  # a TensorDict, without importing it
    source = tensors.to_dict() if is_td else tensors
    output = {}
    for key in sorted(source):
        value = source[key]
        parts = [torch.empty_like(value) for _ in range(size)]
        dist.all_gather(parts, value.contiguous(), group=group, async_op=False)
        output[key] = torch.cat(parts, dim=dim)
    if is_td:
        return type(tensors)(source=output, batch_size=[tensors.batch_size[0] * size])
    return output


def split_dict_tensor_into_batches(tensors, batch_size: int) -> list:
    """Consecutive TensorDict chunks of ``batch_size`` rows; the row count must be divisible by it."""
    if tensors.batch_size[0] % batch_size != 0:
        raise ValueError(f"input data batch size {tensors.batch_size[0]} must be divisible by batch_size {batch_size}")
    return list(tensors.split(batch_size))


def remove_pad_token(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> list[list[int]]:
    """The token ids of each row where ``attention_mask`` is 1, as Python lists."""
    return [ids[mask.bool()].tolist() for ids, mask in zip(input_ids, attention_mask)]


def tokenize_and_postprocess_data(prompt: str, tokenizer, max_length: int, pad_token_id: int, left_pad: bool = True,
                                  truncation: str = "error"):
    """Tokenize one prompt (no special tokens added) and pad / truncate it to ``max_length`` with
    :func:`postprocess_data`; returns ``(input_ids, attention_mask)`` of shape (1, max_length)."""
    enc = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)
    return postprocess_data(enc["input_ids"], enc["attention_mask"], max_length, pad_token_id, left_pad, truncation)
