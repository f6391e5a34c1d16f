"""Forward passes of Hugging Face models in the engine's output conventions (see ``engine/base.py``).

Three ways to feed a micro-batch to the model, chosen by ``verl.utils.padding.remove_padding_mode``:

- ``pack``: the valid tokens of all rows in one row, attention kept per sequence through packed
  ``position_ids`` (flash-attention models, and models on ``verl_varlen`` attention, which get the rows'
  borders as ``cu_seq_lens_q``; elsewhere a packed row costs O(total_tokens^2) attention);
- ``trim``: only the columns that hold a valid token in some row (left-padded prompts, right-padded
  responses), the same results as the full width at a fraction of the compute;
- ``padded``: every column.

Vision-language micro-batches carry their images as the padded tensors ``mm_pixel_values`` /
``mm_image_grid_thw`` (see ``verl.utils.dataset.vision_utils``): the rows' images are unpadded and passed as
``pixel_values`` / ``image_grid_thw``, and 3-row position ids (B, 3, T) are handed over as the (3, B, T) the
Qwen2-VL models take.
"""

from __future__ import annotations

import inspect

import torch
from torch import nn

from verl.utils.chunked_head import hidden_state_head
from verl.utils.dataset.vision_utils import unpad_multi_modal_inputs
from verl.utils.padding import (pack_batch, place_response_window, remove_padding_mode, response_window,
                                unpack_to_padded, valid_column_span)
from verl.utils.torch_functional import entropy_for_loss, logprobs_from_logits
from verl.utils.varlen_attention import VARLEN_ATTENTION

__all__ = ["forward_log_probs", "forward_logits", "forward_values", "forward_scores", "token_values"]


def _packed_kwargs(module: nn.Module, cu_seqlens: torch.Tensor) -> dict:
    """The sequence borders of a packed row for the ``verl_varlen`` attention (flash-attn's keyword names), so
    no layer has to find them again from the position ids; nothing for other implementations."""
    config = getattr(module, "config", None)
    if str(getattr(config, "_attn_implementation", "") or "") != VARLEN_ATTENTION:
        return {}
    longest = int((cu_seqlens[1:] - cu_seqlens[:-1]).max()) if cu_seqlens.numel() > 1 else 0
    return {"cu_seq_lens_q": cu_seqlens, "cu_seq_lens_k": cu_seqlens, "max_length_q": longest, "max_length_k": longest}


def _model_inputs(micro_batch, position_ids: torch.Tensor, batch_first: bool = True) -> dict:
    """``position_ids`` in the model's layout plus the micro-batch's images (nothing extra for text).
    ``batch_first``: 3-D ids are (B, 3, T) (padded rows) rather than packed (3, 1, total)."""
    if position_ids.dim() == 3 and batch_first:  # (B, 3, T) -> (3, B, T)
        position_ids = position_ids.transpose(0, 1)
    return {"position_ids": position_ids, **unpad_multi_modal_inputs(micro_batch)}


def accepts_logits_to_keep(module: nn.Module) -> bool:
    """Whether ``module.forward`` takes ``logits_to_keep`` (Hugging Face causal LMs: the LM head is applied to the
    last N positions only; a PEFT wrapper passes it through as a keyword)."""
    forward = getattr(module, "forward", None)
    try:
        params = inspect.signature(forward).parameters
    except (TypeError, ValueError):
        return False
    if "logits_to_keep" in params:
        return True
    base = getattr(module, "get_base_model", None)  # PEFT: forward(*args, **kwargs) -> the base model's forward
    return callable(base) and base() is not module and accepts_logits_to_keep(base())


def _next_tokens(input_ids: torch.Tensor, start: int, stop: int) -> torch.Tensor:
    """The label of every position in ``[start, stop)``: the next token (0 past the end, where nothing is scored)."""
    labels = input_ids[:, start + 1 : stop + 1]
    missing = (stop - start) - labels.shape[1]
    return torch.nn.functional.pad(labels, (0, missing)) if missing > 0 else labels


def forward_log_probs(module: nn.Module, micro_batch, temperature: float = 1.0, calculate_entropy: bool = False,
                      use_remove_padding: bool = False, entropy_grad: bool = True, fused_chunk_size: int = 0):
    """Log-probs (and entropies) of the response tokens of one micro-batch: returns ``(entropy, log_probs)``.

    ``micro_batch`` holds ``input_ids``, ``attention_mask``, ``position_ids`` (B, T) and ``responses`` (B, R);
    the response occupies the last R columns. Logits are divided by ``temperature`` before the softmax.
    ``entropy_grad=False`` computes the entropy from detached logits (a metric only: no graph is kept for it).
    ``fused_chunk_size > 0`` (``model.use_fused_kernels``): the output layer computes log-probs and entropies in
    chunks of that many tokens from the hidden states, never holding ``[tokens, vocab]`` logits
    (``verl.utils.chunked_head``); same values and gradients.
    """
    if fused_chunk_size > 0:
        return _fused_log_probs(module, micro_batch, temperature, calculate_entropy, use_remove_padding,
                                entropy_grad, fused_chunk_size)
    input_ids = micro_batch["input_ids"]
    attention_mask = micro_batch["attention_mask"]
    position_ids = micro_batch["position_ids"]
    response_length = micro_batch["responses"].shape[-1]
    batch, seqlen = input_ids.shape
    entropy = None
    mode = remove_padding_mode(module) if use_remove_padding else "padded"
    if mode == "pack":
        ids, pos, indices, cu = pack_batch(input_ids, attention_mask, position_ids)
        logits = module(input_ids=ids, attention_mask=None, use_cache=False,
                        **_model_inputs(micro_batch, pos, batch_first=False), **_packed_kwargs(module, cu)).logits[0]
        logits = logits / temperature
        labels = torch.roll(ids[0], shifts=-1)  # token t+1 is the label of position t (wrap-around is masked)
        log_probs = unpack_to_padded(logprobs_from_logits(logits, labels), indices, batch, seqlen)
        log_probs = log_probs[:, -response_length - 1 : -1]
        if calculate_entropy:
            ent = entropy_for_loss(logits, entropy_grad)
            entropy = unpack_to_padded(ent, indices, batch, seqlen)[:, -response_length - 1 : -1]
    else:
        lo, hi = valid_column_span(attention_mask) if mode == "trim" else (0, seqlen)
        s, e = response_window(seqlen, response_length, lo, hi)
        # the LM head runs only on the positions that score response tokens (prompt positions need no logits)
        keep = {"logits_to_keep": hi - s} if accepts_logits_to_keep(module) else {}
        output = module(input_ids=input_ids[:, lo:hi], attention_mask=attention_mask[:, lo:hi], use_cache=False,
                        **_model_inputs(micro_batch, position_ids[..., lo:hi]), **keep)
        logits = output.logits[:, : e - s, :] if keep else output.logits[:, s - lo : e - lo, :]
        logits = logits / temperature
        first = s - (seqlen - response_length - 1)  # response column of position s
        log_probs = place_response_window(logprobs_from_logits(logits, input_ids[:, s + 1 : e + 1]),
                                          response_length, first)
        if calculate_entropy:
            ent = entropy_for_loss(logits, entropy_grad)
            entropy = place_response_window(ent, response_length, first)
    return entropy, log_probs.float()


def _fused_log_probs(module: nn.Module, micro_batch, temperature: float, calculate_entropy: bool,
                     use_remove_padding: bool, entropy_grad, chunk_size: int):
    """:func:`forward_log_probs` with the chunked output layer (same layouts: pack, trim, padded)."""
    input_ids = micro_batch["input_ids"]
    attention_mask = micro_batch["attention_mask"]
    position_ids = micro_batch["position_ids"]
    response_length = micro_batch["responses"].shape[-1]
    batch, seqlen = input_ids.shape
    mode = remove_padding_mode(module) if use_remove_padding else "padded"
    entropy = None
    if mode == "pack":
        ids, pos, indices, cu = pack_batch(input_ids, attention_mask, position_ids)
        labels = torch.roll(ids, shifts=-1, dims=-1)  # token t+1 is the label of position t (wrap-around is masked)
        with hidden_state_head(module, labels, temperature, chunk_size, calculate_entropy):
            out = module(input_ids=ids, attention_mask=None, use_cache=False,
                         **_model_inputs(micro_batch, pos, batch_first=False), **_packed_kwargs(module, cu)).logits[0]
        log_probs = unpack_to_padded(out[:, 0], indices, batch, seqlen)[:, -response_length - 1 : -1]
        if calculate_entropy:
            ent = out[:, 1] if entropy_grad else out[:, 1].detach()
            entropy = unpack_to_padded(ent, indices, batch, seqlen)[:, -response_length - 1 : -1]
        return entropy, log_probs.float()
    lo, hi = valid_column_span(attention_mask) if mode == "trim" else (0, seqlen)
    s, e = response_window(seqlen, response_length, lo, hi)
    keep = {"logits_to_keep": hi - s} if accepts_logits_to_keep(module) else {}
    first_seen = s if keep else lo  # the first position the output layer sees
    labels = _next_tokens(input_ids, first_seen, hi)
    with hidden_state_head(module, labels, temperature, chunk_size, calculate_entropy):
        out = module(input_ids=input_ids[:, lo:hi], attention_mask=attention_mask[:, lo:hi], use_cache=False,
                     **_model_inputs(micro_batch, position_ids[..., lo:hi]), **keep).logits
    out = out[:, s - first_seen : e - first_seen]
    first = s - (seqlen - response_length - 1)  # response column of position s
    log_probs = place_response_window(out[..., 0], response_length, first)
    if calculate_entropy:
        entropy = place_response_window(out[..., 1] if entropy_grad else out[..., 1].detach(), response_length, first)
    return entropy, log_probs.float()


def forward_logits(module: nn.Module, micro_batch, temperature: float = 1.0,
                   use_remove_padding: bool = False) -> torch.Tensor:
    """Next-token logits (B, R, V) at the positions that score the R response tokens, divided by
    ``temperature``; columns outside the computed window are 0. Full distributions are what distillation
    losses compare. ``use_remove_padding`` computes only the valid columns (``trim``; a packed row is not used
    here, so flash-attention models take the trimmed path too)."""
    input_ids, attention_mask = micro_batch["input_ids"], micro_batch["attention_mask"]
    response_length = micro_batch["responses"].shape[-1]
    seqlen = input_ids.shape[1]
    lo, hi = valid_column_span(attention_mask) if use_remove_padding else (0, seqlen)
    s, e = response_window(seqlen, response_length, lo, hi)
    output = module(input_ids=input_ids[:, lo:hi], attention_mask=attention_mask[:, lo:hi], use_cache=False,
                    **_model_inputs(micro_batch, micro_batch["position_ids"][..., lo:hi]))
    logits = output.logits[:, s - lo : e - lo, :].float() / temperature
    if logits.shape[1] == response_length:
        return logits
    first = s - (seqlen - response_length - 1)
    out = logits.new_zeros(logits.shape[0], response_length, logits.shape[2])
    out[:, first : first + logits.shape[1]] = logits
    return out


def token_values(output) -> torch.Tensor:
    """Per-token values from a model output: ``logits[..., 0]`` of a token classifier, or a value-head tuple."""
    if hasattr(output, "logits"):
        return output.logits[..., 0] if output.logits.dim() == 3 else output.logits
    if isinstance(output, tuple) and len(output) >= 3:  # (lm_logits, loss, values) value-head models
        return output[2]
    raise TypeError(f"cannot read values from a model output of type {type(output).__name__}")


def forward_values(module: nn.Module, micro_batch, use_remove_padding: bool = False) -> torch.Tensor:
    """Values (B, R) for the states preceding each response token (position t predicts token t+1)."""
    input_ids = micro_batch["input_ids"]
    attention_mask = micro_batch["attention_mask"]
    response_length = micro_batch["responses"].shape[-1]
    batch, seqlen = input_ids.shape
    mode = remove_padding_mode(module) if use_remove_padding else "padded"
    if mode == "pack":
        ids, pos, indices, cu = pack_batch(input_ids, attention_mask, micro_batch["position_ids"])
        values = token_values(module(input_ids=ids, attention_mask=None, use_cache=False,
                                     **_model_inputs(micro_batch, pos, batch_first=False), **_packed_kwargs(module, cu)))
        values = unpack_to_padded(values[0], indices, batch, seqlen)
        return values[:, -response_length - 1 : -1].float()
    lo, hi = valid_column_span(attention_mask) if mode == "trim" else (0, seqlen)
    s, e = response_window(seqlen, response_length, lo, hi)
    inputs = _model_inputs(micro_batch, micro_batch["position_ids"][..., lo:hi])
    values = token_values(module(input_ids=input_ids[:, lo:hi], attention_mask=attention_mask[:, lo:hi],
                                 use_cache=False, **inputs))
    return place_response_window(values[:, s - lo : e - lo].float(), response_length,
                                 s - (seqlen - response_length - 1))


def _score_head(module: nn.Module) -> nn.Module:
    for name in ("score", "classifier", "v_head"):
        head = getattr(module, name, None)
        if isinstance(head, nn.Module):
            return head
    raise TypeError(f"{type(module).__name__} has no classification head (score / classifier / v_head): a reward "
                    "model must be a sequence-classification model (AutoModelForSequenceClassification)")


def forward_scores(module: nn.Module, micro_batch, use_remove_padding: bool = False) -> torch.Tensor:
    """A sequence classifier's head output at *every* position (B, T), without the model's own pooling; zeros on
    padding when ``use_remove_padding`` packs the rows or trims all-padding columns (as for values).

    The head's per-token output is captured by a forward hook during the ordinary forward call, so sharded
    (FSDP) models gather their parameters as usual.
    """
    input_ids, attention_mask = micro_batch["input_ids"], micro_batch["attention_mask"]
    batch, seqlen = input_ids.shape
    mode = remove_padding_mode(module) if use_remove_padding else "padded"
    captured = {}
    handle = _score_head(module).register_forward_hook(lambda _m, _inp, out: captured.__setitem__("out", out))
    try:
        if mode == "pack":
            ids, pos, indices, cu = pack_batch(input_ids, attention_mask, micro_batch["position_ids"])
            out = module(input_ids=ids, attention_mask=None, position_ids=pos, use_cache=False)
        else:
            lo, hi = valid_column_span(attention_mask) if mode == "trim" else (0, seqlen)
            out = module(input_ids=input_ids[:, lo:hi], attention_mask=attention_mask[:, lo:hi],
                         position_ids=micro_batch["position_ids"][..., lo:hi], use_cache=False)
    finally:
        handle.remove()
    head = captured["out"][..., 0].float()
    if mode == "pack":
        scores = unpack_to_padded(head[0], indices, batch, seqlen)
    elif mode == "trim":
        scores = head.new_zeros(batch, seqlen)
        scores[:, lo:hi] = head
    else:
        scores = head
    logits = getattr(out, "logits", None)
    if torch.is_grad_enabled() and isinstance(logits, torch.Tensor) and logits.requires_grad:
        # training a reward model: FSDP2 re-gathers parameters for backward (and reduces gradients after it)
        # from hooks on the model's own output, so the result must depend on that output (by zero)
        scores = scores + 0.0 * logits.sum()
    return scores
