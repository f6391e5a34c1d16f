"""The ``<role>.megatron.*`` keys: verl's defaults and what the Megatron engine can run with a given HF config.

Readable without megatron-core (torch and the architecture table only), so the driver's config validation refuses
an unsupported setting before any worker starts; ``verl.workers.engine.megatron`` applies the same checks.
"""

from __future__ import annotations

import dataclasses

import torch

from verl.models.mcore import get_arch
from verl.models.mcore.convert import num_experts
from verl.trainer.config_schema.engine import MegatronConfig

__all__ = ["MEGATRON_DTYPES", "REFUSED", "CONVERTER_SWITCHES", "OFFLOAD_KEYS", "MCORE_OPTIMIZER_FIELDS",
           "ATTENTION_BACKENDS", "megatron_settings", "check_megatron_settings", "transformer_overrides",
           "optimizer_overrides"]

MEGATRON_DTYPES = {"fp32": torch.float32, "float32": torch.float32, "float": torch.float32, "bf16": torch.bfloat16,
                   "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16, "half": torch.float16}

REFUSED = {  # key: (value that works, why)
    "context_parallel_size": (1, "context parallelism needs CUDA (Transformer Engine's attention)"),
}
# values that mean "no such parallelism" besides the default
_ALSO_FINE: dict = {}

# verl's switches between weight converters (mbridge or its own). This engine converts HF weights with its own
# per-architecture table, so every value of these loads the same weights; they are accepted as they are.
CONVERTER_SWITCHES = ("use_mbridge", "vanilla_mbridge")

# verl's host-offload switches. On CPU the parameters, gradients and optimizer state already live in host memory,
# so true asks for nothing more there and is accepted; this engine does not move them off an accelerator.
OFFLOAD_KEYS = ("param_offload", "grad_offload", "optimizer_offload")

# TransformerConfig fields the engine derives from the HF config and the megatron.* sizes: overriding one would
# make the model disagree with its checkpoint or its process grid.
_ENGINE_OWNED = frozenset({
    "num_layers", "hidden_size", "num_attention_heads", "num_query_groups", "kv_channels", "ffn_hidden_size",
    "normalization", "layernorm_epsilon", "gated_linear_unit", "activation_func", "add_bias_linear", "add_qkv_bias",
    "tensor_model_parallel_size", "pipeline_model_parallel_size", "virtual_pipeline_model_parallel_size",
    "sequence_parallel", "params_dtype",
    "pipeline_dtype", "bf16", "fp16", "use_cpu_initialization", "perform_initialization", "init_method_std",
})
# fused kernels that need CUDA (Transformer Engine / apex)
_CUDA_FUSIONS = frozenset({
    "gradient_accumulation_fusion", "apply_rope_fusion", "bias_activation_fusion", "bias_dropout_fusion",
    "masked_softmax_fusion", "persist_layer_norm", "moe_permute_fusion", "cross_entropy_loss_fusion",
})


# megatron-core's AttnBackend names. The value picks among Transformer Engine's attention kernels; this engine's
# layers are built from megatron-core's own modules (no Transformer Engine), whose attention is the same for each
ATTENTION_BACKENDS = ("flash", "fused", "unfused", "local", "auto")


# megatron-core OptimizerConfig fields that verl's Megatron scripts pass in optim.override_optimizer_config. This
# engine steps torch's optimizer (optim.optimizer) over each rank's shards with fp32 master weights, gradients and
# Adam moments, so these are taken out of that optimizer's keyword arguments (optimizer_overrides) and accepted where
# the engine already does what they ask
_FP32 = ("fp32", "float32", "torch.float32")
MCORE_OPTIMIZER_FIELDS = ("optimizer_cpu_offload", "optimizer_offload_fraction", "overlap_cpu_optimizer_d2h_h2d",
                          "use_precision_aware_optimizer", "main_grads_dtype", "main_params_dtype", "exp_avg_dtype",
                          "exp_avg_sq_dtype")


def optimizer_overrides(over: dict, prefix: str, on_cpu: bool) -> dict:
    """``<role>.optim.override_optimizer_config`` of a Megatron role: checks megatron-core's optimizer fields (see
    ``MCORE_OPTIMIZER_FIELDS``) and returns the other entries, the keyword arguments of the torch optimizer."""
    over = dict(over or {})
    if over.get("optimizer_cpu_offload") and not on_cpu:
        raise ValueError(f"{prefix}.optimizer_cpu_offload=True: the Megatron engine keeps the optimizer state on the "
                         "accelerator; use false (strategy=fsdp offloads it with fsdp_config.optimizer_offload)")
    fraction = over.get("optimizer_offload_fraction")
    if fraction is not None and not (isinstance(fraction, (int, float)) and 0 <= fraction <= 1):
        raise ValueError(f"{prefix}.optimizer_offload_fraction={fraction!r} must be a number in [0, 1]")
    for k in ("main_grads_dtype", "main_params_dtype", "exp_avg_dtype", "exp_avg_sq_dtype"):
        if k in over and str(over[k]) not in _FP32:
            raise ValueError(f"{prefix}.{k}={over[k]!r} is not supported: this engine keeps master weights, "
                             "gradients and Adam moments in fp32; use fp32")
    # use_precision_aware_optimizer with fp32 main dtypes computes the update this engine computes; on CPU the
    # optimizer state lives in host memory, which is what optimizer_cpu_offload (fraction 1) and the overlap ask for
    return {k: v for k, v in over.items() if k not in MCORE_OPTIMIZER_FIELDS}


# the schema's defaults of the keys below that have one (a section built by hand may leave any of them out)
_SCHEMA_DEFAULTS = {f.name: f.default for f in dataclasses.fields(MegatronConfig)
                    if f.name in ("sequence_parallel", "use_distributed_optimizer", "seed")}


def megatron_settings(cfg: dict) -> dict:
    """The ``megatron.*`` keys with the schema's defaults (``MegatronConfig``) for the ones ``cfg`` leaves out."""
    cfg = {**_SCHEMA_DEFAULTS, **{k: v for k, v in dict(cfg or {}).items() if v is not None}}
    tp = int(cfg.get("tensor_model_parallel_size") or 1)
    return {
        "tp": tp, "pp": int(cfg.get("pipeline_model_parallel_size") or 1),
        # virtual pipeline stages (interleaved schedule): model chunks per pipeline rank; null means 1
        "vpp": int(cfg.get("virtual_pipeline_model_parallel_size") or 1),
        "sequence_parallel": bool(cfg["sequence_parallel"]) and tp > 1,
        # expert parallel (mixture-of-experts models): experts split over ep ranks, each cut over etp ranks
        # (megatron's default: the tensor-parallel size)
        "ep": int(cfg.get("expert_model_parallel_size") or 1),
        "etp": int(cfg.get("expert_tensor_parallel_size") or tp),
        "use_distributed_optimizer": bool(cfg["use_distributed_optimizer"]),
        "seed": int(cfg["seed"]),
        "dtype": cfg.get("dtype"), "raw": cfg,
        # use_dist_checkpointing: the initial weights come from this Megatron distributed checkpoint, not model.path
        "dist_ckpt": (str(cfg.get("dist_checkpointing_path") or "") or None) if cfg.get("use_dist_checkpointing")
        else None,
        "dist_ckpt_prefix": str(cfg.get("dist_checkpointing_prefix") or ""),
        "converter": {k: cfg[k] for k in CONVERTER_SWITCHES if k in cfg},  # recorded; the same weights either way
    }


def transformer_overrides(cfg: dict, prefix: str, on_cpu: bool) -> dict:
    """``<role>.megatron.override_transformer_config``: megatron-core ``TransformerConfig`` fields the engine applies
    over its own (e.g. ``recompute_granularity=full``, ``moe_router_dtype=fp32``). Refuses, naming the key, the
    fields the engine derives from the model and the sizes, and on CPU the fusions and the token dispatcher that
    need CUDA kernels."""
    over = {k: v for k, v in dict((cfg or {}).get("override_transformer_config") or {}).items() if v is not None}
    backend = over.pop("attention_backend", "flash")
    if backend not in ATTENTION_BACKENDS:
        raise ValueError(f"{prefix}.override_transformer_config.attention_backend={backend!r} is not one of "
                         f"{', '.join(ATTENTION_BACKENDS)}")
    for k, v in over.items():
        if k in _ENGINE_OWNED:
            raise ValueError(f"{prefix}.override_transformer_config.{k} is set by the engine from the model's "
                             "config and the megatron.* sizes; remove it")
        if on_cpu and k in _CUDA_FUSIONS and v:
            raise ValueError(f"{prefix}.override_transformer_config.{k}={v!r} needs CUDA kernels (Transformer "
                             "Engine / apex); on CPU set it to false or remove it")
        if on_cpu and ((k == "moe_token_dispatcher_type" and v == "flex") or (k == "moe_enable_deepep" and v)):
            raise ValueError(f"{prefix}.override_transformer_config.{k}={v!r}: the flex token dispatcher (DeepEP) "
                             "needs CUDA kernels; on CPU remove it (the engine uses moe_token_dispatcher_type="
                             "alltoall)")
        # recompute_granularity (full / selective) runs on CPU too: verl.utils.megatron.cpu_compat saves and
        # restores the CPU generator states around the recomputation where megatron saves the CUDA ones
    return over


def check_megatron_settings(cfg: dict, hf_config, prefix: str, on_cpu: bool = False) -> None:
    """Refuse what this engine cannot run, naming ``<prefix>.<key>`` (call before any worker starts)."""
    s = megatron_settings(cfg)
    for k, (ok, why) in REFUSED.items():
        value = s["raw"].get(k, ok)
        if value not in (ok, None) and not (ok == 1 and value == 1) and value not in _ALSO_FINE.get(k, ()):
            raise ValueError(f"{prefix}.{k}={value!r} is not supported: {why}; use {ok!r}")
    for k in OFFLOAD_KEYS:
        if s["raw"].get(k) and not on_cpu:
            raise ValueError(f"{prefix}.{k}=True: the Megatron engine does not offload to host memory on an "
                             "accelerator; use false (strategy=fsdp offloads)")
    if s["raw"].get("use_dist_checkpointing") and not s["dist_ckpt"]:
        raise ValueError(f"{prefix}.use_dist_checkpointing=True needs {prefix}.dist_checkpointing_path: the directory "
                         "of a Megatron distributed checkpoint (`python -m verl.models.mcore.converter_hf_to_mcore "
                         "--hf_model_path <hf dir> --output_path <dir>` writes one); or set use_dist_checkpointing="
                         "False to load model.path's HF weights")
    transformer_overrides(cfg, prefix, on_cpu)
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
    if s["vpp"] > 1 and s["pp"] == 1:
        raise ValueError(f"{prefix}.virtual_pipeline_model_parallel_size={s['vpp']} needs "
                         f"{prefix}.pipeline_model_parallel_size > 1 (virtual stages interleave pipeline ranks); "
                         "set it to null or set pipeline_model_parallel_size")
    if layers % (s["pp"] * s["vpp"]):
        fits = [v for v in range(1, layers // s["pp"] + 1) if layers % (s["pp"] * v) == 0]
        raise ValueError(f"{prefix}.virtual_pipeline_model_parallel_size={s['vpp']}: pipeline_model_parallel_size x "
                         f"virtual_pipeline_model_parallel_size = {s['pp']} x {s['vpp']} must divide the model's "
                         f"{layers} layers; use one of {fits} (or null)")
    if s["dtype"] is not None and str(s["dtype"]) not in MEGATRON_DTYPES:
        raise ValueError(f"{prefix}.dtype={s['dtype']!r} is not one of {sorted(MEGATRON_DTYPES)}")
    _check_experts(s, hf_config, prefix)


def _check_experts(s: dict, hf_config, prefix: str) -> None:
    """Expert parallel only for a mixture-of-experts model, in sizes that split its experts evenly."""
    arch = get_arch(hf_config)
    archs = getattr(hf_config, "architectures", None) or [hf_config.model_type]
    if not arch.experts:
        for key, size in (("expert_model_parallel_size", s["ep"]), ("expert_tensor_parallel_size", s["etp"])):
            if key in s["raw"] and s["raw"][key] is not None and size not in (1, s["tp"]):
                raise ValueError(f"{prefix}.{key}={size}: the model ({', '.join(archs)}) has no experts; expert "
                                 "parallelism needs a mixture-of-experts model (Qwen3MoeForCausalLM, "
                                 f"Qwen2MoeForCausalLM, DeepseekV3ForCausalLM); use {key}=1")
        return
    experts = num_experts(hf_config)
    if experts % s["ep"]:
        fits = [e for e in range(1, experts + 1) if experts % e == 0]
        raise ValueError(f"{prefix}.expert_model_parallel_size={s['ep']} must divide the model's {experts} experts; "
                         f"use one of {fits}")
    if s["tp"] > 1 and not s["sequence_parallel"]:
        raise ValueError(f"{prefix}.sequence_parallel=False with tensor_model_parallel_size={s['tp']}: megatron-core's "
                         "mixture-of-experts layers under tensor parallelism need sequence parallel; set "
                         "sequence_parallel=True")
    dispatcher = dict(s["raw"].get("override_transformer_config") or {}).get("moe_token_dispatcher_type")
    if dispatcher == "allgather" and s["ep"] > 1:
        raise ValueError(f"{prefix}.override_transformer_config.moe_token_dispatcher_type='allgather' with "
                         f"expert_model_parallel_size={s['ep']}: megatron-core's all-gather dispatcher needs the same "
                         "token count on every expert-parallel rank, and this engine trims each micro-batch to its "
                         "longest row; use moe_token_dispatcher_type=alltoall")
    if s["etp"] > 1:  # each expert's fc1 output (gate and up, moe_intermediate_size each) splits in etp pieces
        inter = int(getattr(hf_config, "moe_intermediate_size", 0) or 0)
        if inter % s["etp"]:
            raise ValueError(f"{prefix}.expert_tensor_parallel_size={s['etp']} must divide the experts' "
                             f"moe_intermediate_size ({inter}); use 1")
