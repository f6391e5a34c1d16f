"""Small helpers shared by the rollout engines: dtypes, sampling filters, response masks."""

from __future__ import annotations

from typing import Any, Iterable

import torch

from verl.utils.config import cfg_get

__all__ = [
    "resolve_torch_dtype",
    "filter_logits_top_k_top_p",
    "eos_id_list",
    "response_mask_from_eos",
    "pad_right",
    "sampling_params_for",
]

_DTYPES = {
    "float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
}



def resolve_torch_dtype(dtype: Any, default: torch.dtype = torch.float32) -> torch.dtype:
    """'bfloat16' / 'bf16' / 'fp32' / torch.float16 ... -> torch.dtype."""
    if dtype is None:
        return default
    if isinstance(dtype, torch.dtype):
        return dtype
    key = str(dtype).lower().replace("torch.", "")
    if key not in _DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; use one of float32/fp32, bfloat16/bf16, float16/fp16")
    return _DTYPES[key]


def eos_id_list(eos_token_id: Any) -> list[int]:
    """An int, a list of ints or None -> list of ints."""
    if eos_token_id is None:
        return []
    if isinstance(eos_token_id, torch.Tensor):
        return [int(x) for x in eos_token_id.reshape(-1).tolist()]
    if isinstance(eos_token_id, Iterable) and not isinstance(eos_token_id, (str, bytes)):
        return [int(x) for x in eos_token_id]
    return [int(eos_token_id)]


def response_mask_from_eos(responses: torch.Tensor, eos_token_ids: list[int], dtype=torch.int64) -> torch.Tensor:
    """1 for every response token up to and including the first EOS, 0 after it."""
    if not eos_token_ids:
        return torch.ones_like(responses, dtype=dtype)
    is_eos = torch.isin(responses, torch.tensor(eos_token_ids, device=responses.device))
    # number of EOS strictly before position t; a token is valid while none came before it
    eos_before = torch.cumsum(is_eos.long(), dim=1) - is_eos.long()
    return (eos_before == 0).to(dtype)


def pad_right(t: torch.Tensor, length: int, value) -> torch.Tensor:
    """Right-pad (or keep) the last dim of a 2-D tensor to ``length``."""
    if t.size(1) >= length:
        return t[:, :length]
    pad = torch.full((t.size(0), length - t.size(1)), value, dtype=t.dtype, device=t.device)
    return torch.cat([t, pad], dim=1)


def filter_logits_top_k_top_p(logits: torch.Tensor, top_k: int = -1, top_p: float = 1.0) -> torch.Tensor:
    """Set logits outside the top-k set and outside the top-p nucleus to -inf (always keeps the argmax).

    ``top_k <= 0`` and ``top_p >= 1`` disable the respective filter (verl's / vLLM's convention).
    """
    if top_k is not None and 0 < top_k < logits.size(-1):
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, sorted_idx = torch.sort(logits, dim=-1, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        # drop a token when the tokens ranked above it already reach top_p
        drop_sorted = (torch.cumsum(probs, dim=-1) - probs) > top_p
        drop_sorted[..., 0] = False
        drop = torch.zeros_like(drop_sorted).scatter(-1, sorted_idx, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def sampling_params_for(config: Any, meta_info: dict) -> dict:
    """Resolve the sampling settings for one ``generate_sequences`` call, the way verl does.

    * training (default): ``n``, ``temperature``, ``top_p``, ``top_k``, ``do_sample`` from the rollout config;
    * ``meta_info["validate"]``: the same keys from ``rollout.val_kwargs`` with ``n=1`` (the validation loop
      repeats the prompts ``val_kwargs.n`` times itself);
    * ``do_sample=False`` (config or ``meta_info["do_sample"]``): greedy, ``n=1``.
    """
    if meta_info.get("validate", False):
        src = cfg_get(config, "val_kwargs", {})
        params = dict(n=1, temperature=float(cfg_get(src, "temperature", 0.0)), top_p=float(cfg_get(src, "top_p", 1.0)),
                      top_k=int(cfg_get(src, "top_k", -1)), do_sample=bool(cfg_get(src, "do_sample", False)))
    else:
        params = dict(n=int(cfg_get(config, "n", 1)), temperature=float(cfg_get(config, "temperature", 1.0)),
                      top_p=float(cfg_get(config, "top_p", 1.0)), top_k=int(cfg_get(config, "top_k", -1)),
                      do_sample=bool(cfg_get(config, "do_sample", True)))
    if "do_sample" in meta_info and meta_info["do_sample"] is not None and not meta_info.get("validate", False):
        params["do_sample"] = bool(meta_info["do_sample"])
    if not params["do_sample"] or params["temperature"] <= 0:
        params.update(n=1 if not params["do_sample"] else params["n"], do_sample=False, temperature=0.0,
                      top_p=1.0, top_k=-1)
    return params
