"""The ``<role>.megatron.*`` keys: verl's defaults and what the Megatron engine can run with a given HF config.

Readable without megatron-core (torch and the architecture table only), so the driver's config validation refuses
an unsupported setting before any worker starts; ``verl.workers.engine.megatron`` applies the same checks.
"""

from __future__ import annotations

import torch

from verl.models.mcore import get_arch

__all__ = ["MEGATRON_DTYPES", "REFUSED", "megatron_settings", "check_megatron_settings"]

MEGATRON_DTYPES = {"fp32": torch.float32, "float32": torch.float32, "float": torch.float32, "bf16": torch.bfloat16,
                   "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16, "half": torch.float16}

REFUSED = {  # key: (value that works, why)
    "virtual_pipeline_model_parallel_size": (None, "interleaved pipeline stages are not available in this engine"),
    "context_parallel_size": (1, "context parallelism needs Transformer Engine attention (CUDA)"),
    "expert_model_parallel_size": (1, "the supported architectures (Qwen2, Llama) have no experts"),
    "expert_tensor_parallel_size": (None, "the supported architectures (Qwen2, Llama) have no experts"),
}


def megatron_settings(cfg: dict) -> dict:
    """The ``megatron.*`` keys with verl's defaults filled in."""
    cfg = dict(cfg or {})
    tp = int(cfg.get("tensor_model_parallel_size") or 1)
    return {
        "tp": tp, "pp": int(cfg.get("pipeline_model_parallel_size") or 1),
        "sequence_parallel": bool(cfg.get("sequence_parallel", True)) and tp > 1,
        "use_distributed_optimizer": bool(cfg.get("use_distributed_optimizer", True)),
        "seed": int(cfg.get("seed", 42) if cfg.get("seed") is not None else 42),
        "dtype": cfg.get("dtype"), "raw": cfg,
    }


def check_megatron_settings(cfg: dict, hf_config, prefix: str) -> None:
    """Refuse what this engine cannot run, naming ``<prefix>.<key>`` (call before any worker starts)."""
    s = megatron_settings(cfg)
    for k, (ok, why) in REFUSED.items():
        value = s["raw"].get(k, ok)
        if value not in (ok, None) and not (ok == 1 and value == 1):
            raise ValueError(f"{prefix}.{k}={value!r} is not supported: {why}; use {ok!r}")
    get_arch(hf_config).check(hf_config)
    heads = hf_config.num_attention_heads
    kv = getattr(hf_config, "num_key_value_heads", None) or heads
    if heads % s["tp"] or kv % s["tp"]:
        raise ValueError(f"{prefix}.tensor_model_parallel_size={s['tp']} must divide the model's attention heads "
                         f"({heads}) and key/value heads ({kv})")
    layers = hf_config.num_hidden_layers
    if layers % s["pp"]:
        raise ValueError(f"{prefix}.pipeline_model_parallel_size={s['pp']} must divide the model's "
                         f"{layers} layers")
    if s["dtype"] is not None and str(s["dtype"]) not in MEGATRON_DTYPES:
        raise ValueError(f"{prefix}.dtype={s['dtype']!r} is not one of {sorted(MEGATRON_DTYPES)}")
