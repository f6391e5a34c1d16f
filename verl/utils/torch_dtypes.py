"""The one dtype resolver: config strings ('bf16', 'bfloat16', 'fp32', ...) or torch dtypes -> ``torch.dtype``.

Only torch is imported here, so config checks on the driver can use it without loading transformers."""

from __future__ import annotations

import torch

__all__ = ["to_torch_dtype"]

_DTYPES = {
    "fp32": torch.float32,
    "float32": torch.float32,
    "float": torch.float32,
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
    "half": torch.float16,
}


def to_torch_dtype(dtype: str | torch.dtype | None, default: torch.dtype | None = torch.float32) -> torch.dtype | None:
    """'bf16' / 'bfloat16' / 'fp32' / torch.float32 ... -> torch.dtype (None -> ``default``)."""
    if dtype is None:
        return default
    if isinstance(dtype, torch.dtype):
        return dtype
    key = str(dtype).lower().replace("torch.", "")
    if key not in _DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; use one of fp32, bf16, fp16 (or float32, bfloat16, float16)")
    return _DTYPES[key]
