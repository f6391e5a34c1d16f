"""Small helpers shared by the rollout engines: dtypes, sampling filters, response masks."""

from __future__ import annotations

from typing import Any, Iterable

import torch

from verl.utils.torch_dtypes import to_torch_dtype
from verl.workers.config.rollout import as_rollout_config

# the one dtype resolver ('bf16' / 'bfloat16' / 'fp32' / torch.float16 ... -> torch.dtype), under the name the
# rollout engines import
resolve_torch_dtype = to_torch_dtype

__all__ = [
    "resolve_torch_dtype",
    "filter_logits_top_k_top_p",
    "eos_id_list",
    "response_mask_from_eos",
    "pad_right",
    "sampling_params_for",
    "resolve_sampling",
    "resolve_special_tokens",
]


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


def resolve_special_tokens(*sources: Any) -> tuple[Any, int]:
    """``(eos_token_id, pad_token_id)`` from the first of ``sources`` (generation config, tokenizer, model config,
    in the caller's order of precedence; None entries skipped) that sets each. The EOS may be a list; a missing pad
    token falls back to the first EOS id, then 0 (the padding value of left-padded prompts)."""
    eos = pad = None
    for src in sources:
        if src is None:
            continue
        eos = eos if eos is not None else getattr(src, "eos_token_id", None)
        pad = pad if pad is not None else getattr(src, "pad_token_id", None)
    return eos, int(pad if pad is not None else (eos_id_list(eos) or [0])[0])


SAMPLING_KEYS = ("temperature", "top_p", "top_k", "do_sample")
_RESOLVED_KEYS = ("n",) + SAMPLING_KEYS  # what resolve_sampling returns


def resolve_sampling(config: Any, overrides: dict | None = None, *, validate: bool = False) -> dict:
    """The one place where sampling settings are resolved, for the batch path (``generate_sequences``) and the
    request path (``AsyncRolloutServer.generate``, agent loops).

    Base values: ``n``, ``temperature``, ``top_p``, ``top_k``, ``do_sample`` of the rollout config, or of
    ``rollout.val_kwargs`` when ``validate`` (then ``n=1``: the validation loop repeats prompts itself). Keys of
    ``overrides`` that are not None replace them. ``do_sample=False`` or a temperature of 0 means greedy: ``n=1``
    where sampling was turned off, temperature 0, no top-p/top-k (log-probs then at temperature 1).
    """
    config = as_rollout_config(config)
    src = config.val_kwargs if validate else config
    params = {k: getattr(src, k) for k in _RESOLVED_KEYS}
    if validate:
        params["n"] = 1
    params.update({k: v for k, v in (overrides or {}).items() if k in _RESOLVED_KEYS and v is not None})
    params = dict(n=int(params["n"]), temperature=float(params["temperature"]), top_p=float(params["top_p"]),
                  top_k=int(params["top_k"]), do_sample=bool(params["do_sample"]))
    if not params["do_sample"] or params["temperature"] <= 0:
        params.update(n=1 if not params["do_sample"] else params["n"], do_sample=False, temperature=0.0,
                      top_p=1.0, top_k=-1)
    return params


def sampling_params_for(config: Any, meta_info: dict) -> dict:
    """Sampling settings of one ``generate_sequences`` call, the way verl does: the rollout config's (training),
    ``rollout.val_kwargs`` with ``n=1`` when ``meta_info["validate"]``, and a ``meta_info["do_sample"]`` of a
    training call overriding the config's (see :func:`resolve_sampling`)."""
    validate = bool(meta_info.get("validate", False))
    return resolve_sampling(config, None if validate else {"do_sample": meta_info.get("do_sample")},
                            validate=validate)
