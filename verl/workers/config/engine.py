"""verl's engine config classes, built on the schema's ``*.fsdp_config`` and ``*.megatron`` sections."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from verl.trainer.config_schema.engine import DTYPES, FSDPConfig, MegatronConfig
from verl.trainer.config_schema.spec import key
from verl.utils.config import ConfigError
from verl.workers.config.base import CheckedSection, rekey

__all__ = ["FSDPEngineConfig", "McoreEngineConfig", "TrainingWorkerConfig", "VeOmniEngineConfig"]

FROM_ROLE = ("the engine takes the batch layout from the role's keys (<role>.use_dynamic_bsz, "
             "ppo_micro_batch_size_per_gpu, ppo_max_token_len_per_gpu, log_prob_*); leave the default")
NO_MCORE_DIST_CKPT = ("the Megatron engine saves and loads its own per-rank checkpoints under "
                      "trainer.default_local_dir; leave the default")
NO_VEOMNI = "the VeOmni engine is not available; use FSDPEngineConfig (strategy fsdp / fsdp2) or McoreEngineConfig"


@dataclass(frozen=True)
class _RoleBatchKeys(CheckedSection):
    """Keys of verl's engine base class that verl's workers copy from the role config at run time."""

    use_dynamic_bsz: bool = key(True, "pack micro-batches by token count", unsupported=FROM_ROLE)
    max_token_len_per_gpu: Optional[int] = key(None, "token budget per training micro-batch", ge=1,
                                               unsupported=FROM_ROLE)
    micro_batch_size_per_gpu: Optional[int] = key(None, "rows per training micro-batch", ge=1, unsupported=FROM_ROLE)
    infer_max_token_len_per_gpu: Optional[int] = key(None, "token budget per forward-only micro-batch", ge=1,
                                                     unsupported=FROM_ROLE)
    infer_micro_batch_size_per_gpu: Optional[int] = key(None, "rows per forward-only micro-batch", ge=1,
                                                        unsupported=FROM_ROLE)
    use_fused_kernels: bool = key(False, "chunked log-prob head",
                                  unsupported="set actor_rollout_ref.model.use_fused_kernels (or the role's "
                                              "use_fused_kernels); leave the default")
    use_remove_padding: bool = key(True, "pack sequences without padding",
                                   unsupported="set the model's use_remove_padding (actor_rollout_ref.model / "
                                               "critic.model); leave the default")


@dataclass(frozen=True)
class FSDPEngineConfig(FSDPConfig, _RoleBatchKeys):
    """``<role>.fsdp_config``: how the FSDP2 engine shards a model and in which dtypes it runs."""

    # the yaml's actor section says false and the reference's true; the worker decides per role either way
    forward_only: bool = rekey(FSDPConfig, "forward_only", False, ok=lambda v: isinstance(v, bool))

    grad_offload: bool = key(False, "keep gradients in host memory",
                             unsupported="FSDP2 keeps gradients with their parameters; use param_offload or "
                                         "offload_policy")


@dataclass(frozen=True)
class McoreEngineConfig(MegatronConfig, _RoleBatchKeys):
    """``<role>.megatron``: the parallel sizes and options of the Megatron engine (strategy=megatron)."""

    strategy: str = key("megatron", "engine of this model", choices=("megatron",), read_in=("verl/workers/",))
    dtype: Optional[str] = key(None, "compute dtype of the Megatron model (null: the engine's choice for the "
                                     "device)", choices=DTYPES, read_in=("verl/models/mcore/settings.py",))
    forward_only: bool = key(False, "the model is never trained (set per role)",
                             unsupported="the worker decides per role (actor trains, reference does not); leave the "
                                         "default")
    full_determinism: bool = key(False, "deterministic kernels",
                                 unsupported="not available; runs are seeded with megatron.seed; leave false")
    use_dist_checkpointing: bool = key(False, "megatron-core distributed checkpoints", unsupported=NO_MCORE_DIST_CKPT)
    dist_checkpointing_path: Optional[str] = key(None, "where distributed checkpoints are read",
                                                 unsupported=NO_MCORE_DIST_CKPT)
    dist_checkpointing_prefix: str = key("", "prefix of the distributed checkpoint's keys",
                                         unsupported=NO_MCORE_DIST_CKPT)
    override_ddp_config: dict = key({}, "megatron-core DistributedDataParallelConfig fields",
                                    unsupported="the engine's DDP settings are fixed (gradients reduced in fp32); "
                                                "leave it empty")
    override_mcore_model_config: dict = key({}, "megatron-core model constructor arguments",
                                            unsupported="the engine builds the model from its HF config; use "
                                                        "override_transformer_config; leave it empty")


@dataclass(frozen=True)
class VeOmniEngineConfig(FSDPEngineConfig):
    """verl's VeOmni engine settings. Not available: constructing one raises ConfigError."""

    strategy: str = key("veomni", "engine of this model", unsupported=NO_VEOMNI)
    data_parallel_size: int = key(1, "data parallel size", unsupported=NO_VEOMNI)
    data_parallel_replicate_size: int = key(1, "replicate size", unsupported=NO_VEOMNI)
    data_parallel_shard_size: int = key(1, "shard size", unsupported=NO_VEOMNI)
    tensor_parallel_size: int = key(1, "tensor parallel size", unsupported=NO_VEOMNI)
    expert_parallel_size: int = key(1, "expert parallel size", unsupported=NO_VEOMNI)
    pipeline_parallel_size: int = key(1, "pipeline parallel size", unsupported=NO_VEOMNI)
    context_parallel_size: int = key(1, "context parallel size", unsupported=NO_VEOMNI)
    ulysses_parallel_size: int = key(1, "Ulysses size", unsupported=NO_VEOMNI)
    data_parallel_mode: str = key("fsdp", "ddp | fsdp1 | fsdp2", unsupported=NO_VEOMNI)
    init_device: str = key("meta", "device the weights are created on", unsupported=NO_VEOMNI)
    enable_full_shard: bool = key(False, "ZeRO-3 sharding", unsupported=NO_VEOMNI)
    ckpt_manager: str = key("dcp", "checkpoint manager", unsupported=NO_VEOMNI)
    load_checkpoint_path: Optional[str] = key(None, "checkpoint to load", unsupported=NO_VEOMNI)
    enable_fsdp_offload: bool = key(False, "FSDP1 offload", unsupported=NO_VEOMNI)
    enable_reentrant: bool = key(False, "reentrant checkpointing", unsupported=NO_VEOMNI)
    attn_implementation: Optional[str] = key("flash_attention_2", "attention kernel", unsupported=NO_VEOMNI)
    moe_implementation: Optional[str] = key("eager", "expert kernel", unsupported=NO_VEOMNI)
    force_use_huggingface: bool = key(False, "load through transformers", unsupported=NO_VEOMNI)
    activation_gpu_limit: float = key(0.0, "activation memory kept on the device (GB)", unsupported=NO_VEOMNI)
    basic_modules: Optional[list] = key([], "basic modules", unsupported=NO_VEOMNI)

    def __post_init__(self) -> None:
        raise ConfigError(f"VeOmniEngineConfig: {NO_VEOMNI}")


@dataclass(frozen=True)
class TrainingWorkerConfig(CheckedSection):
    """What verl's generic training worker is built from: the model, engine, optimizer, checkpoint and profiler
    configs of one role, carried together (``model_type`` language_model | value_model)."""

    model_type: Optional[str] = key(None, "language_model | value_model", choices=(None, "language_model",
                                                                                  "value_model"),
                                    read_in=("verl/workers/config/engine.py",))
    model_config: Any = None
    engine_config: Any = None
    optimizer_config: Any = None
    checkpoint_config: Any = None
    profiler_config: Any = None
