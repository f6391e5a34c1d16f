"""Remove-padding ("packing") helpers.

A padded batch ``(B, T)`` with a 0/1 ``attention_mask`` is packed into one row ``(1, total_valid_tokens)``;
each sequence keeps its own ``position_ids`` (0..L-1), so attention must not cross sequence borders.
transformers (>= 4.5x, checked on 5.19) builds that block-diagonal causal mask itself for sdpa / eager /
flex attention when the model is called with ``attention_mask=None`` and packed ``position_ids`` (positions
restarting at 0 mark a new sequence); flash-attention backends read the same ``position_ids``. So a packed
forward is simply ``model(input_ids=packed_ids, position_ids=packed_pos, attention_mask=None, use_cache=False)``.

Names and return shapes follow flash-attn's ``bert_padding`` helpers, which verl's code calls.

Packing needs a variable-length attention kernel: under plain sdpa / eager attention transformers materialises the
block-diagonal mask of the packed row, so attention costs O(total_tokens^2) instead of O(sum of L_i^2) (measured
3.5x slower than the padded path for 256 sequences of 40 tokens). :func:`remove_padding_mode` therefore picks
``"pack"`` for flash-attention models and for models switched to ``verl_varlen`` attention
(``verl.utils.varlen_attention``: the FSDP engine does that on GPUs and NPUs), and ``"trim"`` otherwise: the
padded batch minus the columns that are padding in every row (equal log-probs either way; tested).
``VERL_REMOVE_PADDING_MODE=pack|trim`` overrides the choice.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F


def get_unpad_data(attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(indices of valid tokens in the flattened batch, cu_seqlens int32 (B+1,), max sequence length)."""
    seqlens = attention_mask.sum(dim=-1, dtype=torch.int32)
    indices = torch.nonzero(attention_mask.flatten(), as_tuple=False).flatten()
    max_seqlen = int(seqlens.max().item()) if seqlens.numel() else 0
    cu_seqlens = F.pad(torch.cumsum(seqlens, dim=0, dtype=torch.int32), (1, 0))
    return indices, cu_seqlens, max_seqlen


def index_first_axis(x: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """``x.flatten(0, 1)[indices]`` for x of shape (B, T, ...)."""
    return x.reshape(-1, *x.shape[2:])[indices]


def unpad_input(hidden_states: torch.Tensor, attention_mask: torch.Tensor):
    """(B, T, ...) -> (total, ...), indices, cu_seqlens, max_seqlen_in_batch."""
    indices, cu_seqlens, max_seqlen = get_unpad_data(attention_mask)
    return index_first_axis(hidden_states, indices), indices, cu_seqlens, max_seqlen


def pad_input(hidden_states: torch.Tensor, indices: torch.Tensor, batch: int, seqlen: int) -> torch.Tensor:
    """Inverse of :func:`unpad_input`: (total, ...) -> (B, T, ...) with zeros on padding."""
    out = hidden_states.new_zeros((batch * seqlen, *hidden_states.shape[1:]))
    out[indices] = hidden_states
    return out.reshape(batch, seqlen, *hidden_states.shape[1:])


def pack_batch(input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor | None = None):
    """Pack a padded batch into one row.

    Returns ``(input_ids_rmpad (1, total), position_ids_rmpad (1, total), indices, cu_seqlens)``. When
    ``position_ids`` is None they are rebuilt as 0..L-1 per sequence. Multi-dimensional rope position ids
    (shape (B, C, T)) are packed along the last axis to (C, 1, total).
    """
    batch, seqlen = input_ids.shape
    indices, cu_seqlens, _ = get_unpad_data(attention_mask)
    ids = input_ids.reshape(-1)[indices].unsqueeze(0)
    if position_ids is None:
        seqlens = (cu_seqlens[1:] - cu_seqlens[:-1]).long()
        starts = torch.repeat_interleave(cu_seqlens[:-1].long(), seqlens)
        pos = (torch.arange(ids.shape[1], device=ids.device) - starts).unsqueeze(0)
    elif position_ids.dim() == 3:  # (B, C, T) -> (C, 1, total)
        pos = torch.stack([index_first_axis(position_ids[:, c].unsqueeze(-1), indices)[:, 0] for c in range(position_ids.shape[1])])
        pos = pos.unsqueeze(1)
    else:
        pos = position_ids.reshape(-1)[indices].unsqueeze(0)
    return ids, pos, indices, cu_seqlens


def unpack_to_padded(values: torch.Tensor, indices: torch.Tensor, batch: int, seqlen: int) -> torch.Tensor:
    """(1, total) or (total,) per-token values -> (B, T) with zeros on padding."""
    flat = values.reshape(-1)
    return pad_input(flat.unsqueeze(-1), indices, batch, seqlen).squeeze(-1)


REMOVE_PADDING_MODES = ("pack", "trim")


def remove_padding_mode(module) -> str:
    """How ``use_remove_padding`` is carried out for ``module``: ``"pack"`` (one packed row, needs a varlen
    attention kernel to be fast) or ``"trim"`` (drop all-padding columns). See the module docstring."""
    forced = os.environ.get("VERL_REMOVE_PADDING_MODE", "").strip().lower()
    if forced:
        if forced not in REMOVE_PADDING_MODES:
            raise ValueError(f"VERL_REMOVE_PADDING_MODE={forced!r}: use one of {', '.join(REMOVE_PADDING_MODES)}")
        return forced
    config = getattr(module, "config", None)
    impl = str(getattr(config, "_attn_implementation", "") or "")
    return "pack" if "flash" in impl or impl == "verl_varlen" else "trim"


def valid_column_span(attention_mask: torch.Tensor) -> tuple[int, int]:
    """``(lo, hi)``: the smallest column range holding every valid token of the batch (``(0, 0)`` if none)."""
    cols = torch.nonzero(attention_mask.any(dim=0), as_tuple=False).flatten()
    if cols.numel() == 0:
        return 0, 0
    return int(cols[0]), int(cols[-1]) + 1


def response_window(seqlen: int, response_length: int, lo: int, hi: int) -> tuple[int, int]:
    """Positions ``[s, e)`` whose outputs score the response tokens (position t predicts token t+1), limited to
    positions computed in ``[lo, hi)`` that predict a token inside it; the full window is
    ``[seqlen - R - 1, seqlen - 1)``."""
    start, end = seqlen - response_length - 1, seqlen - 1
    s, e = max(start, lo), min(end, hi - 1)
    return s, max(s, e)


def place_response_window(part: torch.Tensor, response_length: int, first: int) -> torch.Tensor:
    """Per-position values ``part`` (B, e - s) of the computed window -> (B, response_length), starting at response
    column ``first``, zeros elsewhere (those columns are padding in every row). ``part`` itself when it already
    covers the whole response."""
    if part.shape[1] == response_length:
        return part
    out = part.new_zeros(part.shape[0], response_length)
    out[:, first : first + part.shape[1]] = part
    return out


def response_attention_mask(batch) -> torch.Tensor:
    """The response part of ``attention_mask`` (its last ``responses.shape[-1]`` columns) of a ``TensorDict`` or
    ``DataProto``: 1 on response tokens up to and including EOS, 0 after."""
    batch = getattr(batch, "batch", batch)
    return batch["attention_mask"][:, -batch["responses"].shape[-1]:]


def response_mask(batch) -> torch.Tensor:
    """The response-token mask of a batch: ``response_mask`` when present (it may exclude tool or user tokens),
    else :func:`response_attention_mask`. Returns it, never stores it."""
    inner = getattr(batch, "batch", batch)
    return inner["response_mask"] if "response_mask" in inner.keys() else response_attention_mask(inner)

