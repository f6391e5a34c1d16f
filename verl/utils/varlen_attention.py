"""Variable-length attention for packed rows without flash-attn.

A packed row (``verl.utils.padding.pack_batch``) holds several sequences back to back; attention must stay inside
each one. flash-attn's varlen kernel does that in O(sum of L_i^2). Without flash-attn, transformers runs sdpa over
the whole row with a block-diagonal mask: O(total_tokens^2) time and a ``[total, total]`` mask in memory. This
module registers one more attention implementation with transformers, ``"verl_varlen"``, that computes each
sequence's causal attention on its own:

- on CUDA, with PyTorch's built-in variable-length kernel (``torch.nn.attention.varlen.varlen_attn``, a flash
  kernel shipped with torch, forward and backward), when the installed torch has it;
- elsewhere (CPU, NPU, an older torch), with one ``scaled_dot_product_attention(is_causal=True)`` call per sequence.

Calls that carry a padding mask (a padded or trimmed batch) go to transformers' own sdpa path unchanged, so a
model switched to ``"verl_varlen"`` computes padded batches exactly as before.

The sequence borders come from the ``cu_seq_lens_q`` / ``max_length_q`` keywords (flash-attn's names, passed by
``hf_forward``) or, failing those, from the packed ``position_ids`` (a new sequence starts where the position is 0).
"""

from __future__ import annotations

import functools
import inspect
import os

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

try:
    from torch.nn.attention.varlen import varlen_attn as _torch_varlen_attn
except ImportError:  # a torch without the built-in variable-length kernel
    _torch_varlen_attn = None

VARLEN_ATTENTION = "verl_varlen"

_REGISTERED = False


def torch_varlen_kernel():
    """PyTorch's variable-length attention function, or None when the installed torch has none."""
    return _torch_varlen_attn


def has_varlen_kernel(device_type: str) -> bool:
    """Whether packed rows get a sub-quadratic attention kernel on ``device_type``: always through this module's
    per-sequence path; the question is whether it is the fused one (CUDA with a torch that ships it)."""
    return device_type == "cuda" and torch_varlen_kernel() is not None


def packs_with_varlen_attention(device_type: str) -> bool:
    """Whether ``use_remove_padding`` packs rows through ``verl_varlen`` on ``device_type`` (models with sdpa or
    eager attention; flash-attention models pack either way). On GPUs and NPUs a packed row computes only the
    valid tokens; on CPU the trimmed padded batch measured as fast or faster (see the engine docs), so packing is
    used there only when ``VERL_REMOVE_PADDING_MODE=pack`` asks for it."""
    forced = os.environ.get("VERL_REMOVE_PADDING_MODE", "").strip().lower()
    if forced:
        return forced == "pack"
    return device_type != "cpu"


def cu_seqlens_from_positions(position_ids: torch.Tensor) -> tuple[torch.Tensor, int]:
    """``(cu_seqlens int32 (N+1,), max_len)`` of a packed row whose positions restart at 0 for each sequence."""
    pos = position_ids.reshape(-1) if position_ids.dim() <= 2 else position_ids[0].reshape(-1)
    starts = torch.nonzero(pos == 0, as_tuple=False).flatten()
    if starts.numel() == 0 or int(starts[0]) != 0:
        starts = torch.cat([starts.new_zeros(1), starts])
    cu = torch.cat([starts, starts.new_tensor([pos.numel()])]).to(torch.int32)
    return cu, int((cu[1:] - cu[:-1]).max())


@torch.compiler.disable  # a loop over data-dependent bounds: compiled layers call it as it is (no recompiles)
def _per_sequence(query, key, value, cu_seqlens, scaling, sliding_window):
    """(1, H, T, D) tensors -> (1, T, H, D): causal sdpa on each ``[cu[i], cu[i+1])`` slice."""
    gqa = query.shape[1] != key.shape[1]
    bounds = cu_seqlens.tolist()
    outs = []
    for start, end in zip(bounds[:-1], bounds[1:]):
        if end <= start:
            continue
        q, k, v = query[:, :, start:end], key[:, :, start:end], value[:, :, start:end]
        if sliding_window:
            n = end - start
            idx = torch.arange(n, device=query.device)
            keep = (idx[None, :] <= idx[:, None]) & (idx[:, None] - idx[None, :] < sliding_window)
            outs.append(F.scaled_dot_product_attention(q, k, v, attn_mask=keep, scale=scaling, enable_gqa=gqa))
        else:
            outs.append(F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scaling, enable_gqa=gqa))
    return torch.cat(outs, dim=2).transpose(1, 2).contiguous()


@functools.lru_cache(maxsize=None)  # read once per kernel, not on every attention call
def _kernel_keywords(kernel) -> frozenset:
    """The keyword arguments ``kernel`` accepts. torch's varlen function changed between releases: one form takes
    ``is_causal`` and nothing else, a later one ``scale`` and ``window_size`` (causal = ``(-1, 0)``), the newest
    also ``enable_gqa``; each is called with what it has."""
    try:
        return frozenset(inspect.signature(kernel).parameters)
    except (TypeError, ValueError):
        return frozenset()


def fused_call(kernel, query, key, value, cu_seqlens, max_len: int, scaling, sliding_window):
    """Causal attention of packed (T, H, D) tensors through torch's varlen ``kernel``, or None where this
    kernel cannot express the call (a sliding window or a non-default scale it has no argument for); the caller
    then takes the per-sequence path. Grouped-query heads are repeated for a kernel without ``enable_gqa``."""
    params = _kernel_keywords(kernel)
    head_dim = query.shape[-1]
    kwargs = {}
    if "window_size" in params:
        kwargs["window_size"] = (sliding_window - 1, 0) if sliding_window else (-1, 0)
    elif "is_causal" in params and not sliding_window:
        kwargs["is_causal"] = True
    else:
        return None
    if "scale" in params:
        kwargs["scale"] = scaling
    elif scaling is not None and abs(scaling - head_dim**-0.5) > 1e-12:
        return None
    if query.shape[1] != key.shape[1]:
        if "enable_gqa" in params:
            kwargs["enable_gqa"] = True
        else:
            group = query.shape[1] // key.shape[1]
            key, value = key.repeat_interleave(group, dim=1), value.repeat_interleave(group, dim=1)
    return kernel(query, key, value, cu_seqlens, cu_seqlens, max_len, max_len, **kwargs)


FUSED_DTYPES = (torch.float16, torch.bfloat16)  # the flash kernel behind torch's varlen function takes only these


def _fused(query, key, value, cu_seqlens, max_len, scaling, sliding_window):
    if query.dtype not in FUSED_DTYPES:  # fp32 compute keeps the exact per-sequence path
        return None
    q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))  # (T, H, D)
    out = fused_call(torch_varlen_kernel(), q, k, v, cu_seqlens, max_len, scaling, sliding_window)
    return None if out is None else out.unsqueeze(0)


def varlen_attention_forward(module, query, key, value, attention_mask, dropout: float = 0.0,
                             scaling: float | None = None, is_causal=None, **kwargs):
    """transformers attention interface: ``query`` (B, Hq, T, D), ``key``/``value`` (B, Hkv, T, D) ->
    ``((B, T, Hq, D), None)``."""
    packed = attention_mask is None and query.shape[0] == 1 and not kwargs.get("past_key_values")
    cu = kwargs.get("cu_seq_lens_q")
    if packed and cu is None and kwargs.get("position_ids") is not None:
        cu, max_len = cu_seqlens_from_positions(kwargs["position_ids"])
    else:
        max_len = kwargs.get("max_length_q")
    if not packed or cu is None or query.shape[2] != key.shape[2]:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    if kwargs.get("softcap"):
        raise NotImplementedError(f"{VARLEN_ATTENTION}: attention logit soft-capping is not supported; "
                                  "use attn_implementation=eager for this model")
    if dropout and module.training:
        raise NotImplementedError(f"{VARLEN_ATTENTION}: attention dropout is not supported (set it to 0)")
    sliding_window = kwargs.get("sliding_window")
    if max_len is None:
        max_len = int((cu[1:] - cu[:-1]).max())
    out = None
    if query.is_cuda and torch_varlen_kernel() is not None:
        out = _fused(query, key, value, cu.to(query.device, torch.int32), int(max_len), scaling, sliding_window)
    if out is None:
        out = _per_sequence(query, key, value, cu, scaling, sliding_window)
    return out, None


def _mask(*args, **kwargs):
    """Mask builder for ``verl_varlen``: none for a packed row (the kernel keeps sequences apart), transformers'
    sdpa mask when the call carries a padding mask."""
    if kwargs.get("attention_mask") is None:
        return None
    return sdpa_mask(*args, **kwargs)


def register_varlen_attention() -> str:
    """Register ``"verl_varlen"`` with transformers (idempotent); returns the name to set as the model's
    ``attn_implementation``."""
    global _REGISTERED
    if not _REGISTERED:
        AttentionInterface.register(VARLEN_ATTENTION, varlen_attention_forward)
        AttentionMaskInterface.register(VARLEN_ATTENTION, _mask)
        _REGISTERED = True
    return VARLEN_ATTENTION


def use_varlen_attention(model) -> bool:
    """Switch ``model`` (and its sub-configs) from sdpa/eager attention to ``verl_varlen``; False (nothing changed)
    for flash-attention models, which pack natively, and for other implementations."""
    configs = []
    for sub in model.modules():
        cfg = getattr(sub, "config", None)
        if cfg is not None and hasattr(cfg, "_attn_implementation") and all(cfg is not c for c in configs):
            configs.append(cfg)
    if not configs or any(str(c._attn_implementation or "") not in ("sdpa", "eager") for c in configs):
        return False
    name = register_varlen_attention()
    for cfg in configs:
        cfg._attn_implementation = name
    return True
