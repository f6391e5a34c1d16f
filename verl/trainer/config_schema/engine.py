"""Schema of the training-engine sections shared by the actor, reference and critic: ``fsdp_config``, ``optim``,
``checkpoint`` and the Megatron sizes (``*.megatron``, only in ``ppo_megatron_trainer.yaml``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from verl.trainer.config_schema.places import CKPT, ENGINE, FSDP, MEGATRON, WORKERS
from verl.trainer.config_schema.spec import Registered, Section, following, key, section
from verl.workers.engine.registry import engine_names

DTYPES = ("fp32", "float32", "float", "bf16", "bfloat16", "fp16", "float16", "half")
CHECKPOINT_CONTENTS = ("model", "optimizer", "extra", "hf_model")
LR_SCHEDULERS = ("constant", "cosine")
STRATEGIES = Registered(engine_names)  # fsdp, fsdp2, megatron and every name given to register_engine

NO_ULYSSES = "Ulysses sequence parallel is not available yet; use 1"
NO_CHUNKED_ENTROPY = "the entropy is computed in one pass here; leave false"
NO_MEGATRON_OFFLOAD = "refused unless false: the Megatron engine does not offload an accelerator's memory to the host"
NO_MEGATRON_CP = "context parallelism needs CUDA (Transformer Engine's attention); use 1"
HOST_ALREADY = "no effect (parameters already live in host memory)"


def fsdp_strategy_ok(value) -> bool:
    return value in ("fsdp", "fsdp2")


@dataclass(frozen=True)
class WrapPolicy(Section):
    min_num_params: int = key(0, "size-based FSDP wrapping threshold (verl's FSDP1 option)", ge=0,
                              unsupported="FSDP2 shards each transformer layer here (wrap_policy."
                                          "transformer_layer_cls_to_wrap); size-based wrapping is not available; leave 0")
    transformer_layer_cls_to_wrap: Optional[list] = key(
        None, "layer class names sharded as units (default: the model's decoder layers)", read_in=(FSDP,),
        optional=True)


@dataclass(frozen=True)
class MixedPrecision(Section):
    param_dtype: Optional[str] = key(None, "compute dtype of the sharded parameters (overrides fsdp_config.dtype)",
                                     choices=DTYPES, read_in=(FSDP,), optional=True)
    reduce_dtype: Optional[str] = key(None, "gradient reduction dtype (default fp32)", choices=DTYPES, read_in=(FSDP,),
                                      optional=True)
    buffer_dtype: Optional[str] = key(None, "dtype of the model's floating-point buffers (null: as loaded)",
                                      choices=DTYPES, read_in=(FSDP,), optional=True)


@dataclass(frozen=True)
class FSDPConfig(Section):
    """``*.fsdp_config``: how a model is sharded and in which dtypes it runs."""

    wrap_policy: WrapPolicy = section(WrapPolicy)
    param_offload: bool = key(False, "keep parameters in host memory between phases", read_in=(WORKERS,),
                              cpu=HOST_ALREADY)
    optimizer_offload: bool = key(False, "keep optimizer state in host memory between phases", read_in=(WORKERS,),
                                  cpu=HOST_ALREADY)
    offload_policy: bool = key(False, "FSDP2 CPUOffloadPolicy (parameters and gradients on the host)", read_in=(FSDP,),
                               cpu=HOST_ALREADY)
    reshard_after_forward: bool = key(True, "free gathered parameters after each layer's forward", read_in=(FSDP,))
    fsdp_size: int = key(-1, "ranks per FSDP shard group (HSDP when it divides the world size)", ge=1, also=(-1,),
                         also_doc="all ranks", read_in=(WORKERS, FSDP))
    forward_prefetch: bool = key(False, "each layer's forward starts the next layer's all-gather early",
                                 read_in=(FSDP,))
    model_dtype: str = key("fp32", "dtype the weights are loaded in (master weights)", choices=DTYPES,
                           read_in=(WORKERS,))
    use_orig_params: bool = key(False, "FSDP1 flat-parameter option (FSDP2 always keeps the original per-parameter "
                                       "tensors, which is what true asks for)",
                                inert="FSDP2 always keeps the original per-parameter tensors (what true asks for); "
                                      "there is no flat-parameter mode")
    seed: int = key(42, "seed for model initialisation (identical on every rank)", ge=0, read_in=(WORKERS,))
    full_determinism: bool = key(False, "deterministic kernels",
                                 unsupported="not available; runs are seeded with fsdp_config.seed; leave false")
    ulysses_sequence_parallel_size: int = key(1, "Ulysses sequence-parallel group size", ge=1, unsupported=NO_ULYSSES)
    entropy_from_logits_with_chunking: bool = key(False, "compute the entropy 2048 logit rows at a time (less "
                                                  "peak memory, same values)", read_in=(ENGINE,))
    use_torch_compile: bool = key(True, "torch.compile the decoder layers (with the role's own key; either False: "
                                        "eager; unset on CPU: False)", read_in=(ENGINE,))
    entropy_checkpointing: bool = key(False, "recompute the entropy in backward", unsupported=NO_CHUNKED_ENTROPY)
    forward_only: bool = key(False, "the model is never trained (set per role)",
                             unsupported="the worker decides per role (actor trains, reference does not); leave the "
                                         "default")
    strategy: str = key("fsdp", "engine of this model", choices=STRATEGIES, ok=fsdp_strategy_ok,
                        unsupported="the FSDP workers run FSDP2 for both fsdp and fsdp2; use one of those")
    dtype: str = key("bfloat16", "compute dtype (mixed precision); fp32 for exact numerics", choices=DTYPES,
                     read_in=(FSDP,))
    mixed_precision: MixedPrecision = section(MixedPrecision, optional=True)


@dataclass(frozen=True)
class RefFSDPConfig(FSDPConfig):
    forward_only: bool = key(True, "the model is never trained (set per role)",
                             unsupported="the worker decides per role (actor trains, reference does not); leave the "
                                         "default")


MCORE_SCHEDULE = ("the Megatron engine runs the same learning-rate schedule as the FSDP engine (optim.lr_warmup_steps "
                  "/ lr_warmup_steps_ratio, then optim.lr_scheduler_type constant | cosine with min_lr_ratio); leave "
                  "the default")


@dataclass(frozen=True)
class OptimConfig(Section):
    """``*.optim``: optimizer and learning-rate schedule."""

    optimizer: str = key("AdamW", "optimizer class name in optimizer_impl", read_in=(FSDP,))
    optimizer_impl: str = key("torch.optim", "module the optimizer class comes from", read_in=(FSDP,))
    lr: float = key(1e-6, "peak learning rate", ge=0, read_in=(FSDP,))
    lr_warmup_steps_ratio: float = key(0.0, "warm-up steps as a fraction of the total (when lr_warmup_steps <= 0)",
                                       ge=0, le=1, read_in=(FSDP,))
    total_training_steps: int = key(-1, "steps of the LR schedule (filled in by the trainer)", ge=1, also=(-1,),
                                    also_doc="set by the trainer",
                                    unsupported="the trainer fills it in from trainer.total_training_steps (or epochs x "
                                                "batches); set trainer.total_training_steps instead")
    weight_decay: float = key(0.01, "decoupled weight decay", ge=0, read_in=(FSDP,))
    lr_warmup_steps: int = key(-1, "linear warm-up steps", ge=0, also=(-1,), also_doc="use lr_warmup_steps_ratio",
                               read_in=(FSDP,))
    betas: list = key([0.9, 0.999], "Adam betas", read_in=(FSDP,))
    clip_grad: float = key(1.0, "max gradient norm (used when the role's grad_clip is null)", ge=0, read_in=(WORKERS,))
    min_lr_ratio: Optional[float] = key(0.0, "cosine floor as a fraction of lr (null: 0)", ge=0, le=1,
                                        read_in=(FSDP,))
    num_cycles: float = key(0.5, "cosine cycles over the schedule", ge=0, read_in=(FSDP,))
    lr_scheduler_type: str = key("constant", "after warm-up: constant | cosine", choices=LR_SCHEDULERS, read_in=(FSDP,))
    warmup_style: Optional[str] = key(None, "deprecated alias of lr_scheduler_type", choices=LR_SCHEDULERS,
                                      read_in=(FSDP,))
    override_optimizer_config: Optional[dict] = key(None, "extra optimizer keyword arguments (free-form)",
                                                    read_in=(FSDP,))
    eps: Optional[float] = key(None, "Adam epsilon (optimizer default when null)", gt=0, read_in=(FSDP,),
                               optional=True)
    # verl's Megatron optimizer-scheduler keys (ppo_megatron_trainer.yaml carries them): accepted at their defaults
    lr_warmup_init: float = key(0.0, "learning rate at the start of warm-up", ge=0, unsupported=MCORE_SCHEDULE,
                                optional=True)
    lr_decay_steps: Optional[int] = key(None, "decay steps", ge=1, unsupported=MCORE_SCHEDULE, optional=True)
    lr_decay_style: str = key("constant", "constant | linear | cosine | inverse_square_root",
                              unsupported=MCORE_SCHEDULE, optional=True)
    min_lr: float = key(0.0, "floor of the decay", ge=0, unsupported=MCORE_SCHEDULE + " (min_lr_ratio sets the floor)",
                        optional=True)
    weight_decay_incr_style: str = key("constant", "weight decay schedule", unsupported=MCORE_SCHEDULE, optional=True)
    lr_wsd_decay_style: str = key("exponential", "warmup-stable-decay style", unsupported=MCORE_SCHEDULE,
                                  optional=True)
    lr_wsd_decay_steps: Optional[int] = key(None, "warmup-stable-decay steps", ge=1, unsupported=MCORE_SCHEDULE,
                                            optional=True)
    use_checkpoint_opt_param_scheduler: bool = key(False, "take the schedule from the checkpoint",
                                                   unsupported="the schedule is restored with the optimizer state "
                                                               "when a checkpoint is resumed; leave false",
                                                   optional=True)


@dataclass(frozen=True)
class CriticOptimConfig(OptimConfig):
    lr: float = key(1e-5, "peak learning rate", ge=0, read_in=(FSDP,))


@dataclass(frozen=True)
class CheckpointConfig(Section):
    save_contents: list = key(["model", "optimizer", "extra"], "what a checkpoint holds: model | optimizer | extra "
                              "(rng, lr scheduler) | hf_model", items=CHECKPOINT_CONTENTS, read_in=(CKPT,))
    load_contents: list = key(["model", "optimizer", "extra"], "what resuming restores", follows=".save_contents",
                              items=CHECKPOINT_CONTENTS, read_in=(CKPT,))
    async_save: bool = key(False, "save in a background thread",
                           unsupported="async checkpoint saving is not available; use False")


# verl's default entries of override_transformer_config (its yaml carries them, so scripts set them without '+')
TRANSFORMER_OVERRIDE_DEFAULTS = {"recompute_granularity": None, "recompute_modules": ["core_attn"],
                                 "recompute_method": None, "recompute_num_layers": None, "attention_backend": "flash"}


@dataclass(frozen=True)
class MegatronConfig(Section):
    """``*.megatron`` (ppo_megatron_trainer.yaml): parallel sizes of the Megatron engine (strategy=megatron)."""

    tensor_model_parallel_size: int = key(1, "tensor parallel size (must divide the attention and key/value heads)",
                                          ge=1, read_in=(MEGATRON,))
    pipeline_model_parallel_size: int = key(1, "pipeline parallel size (must divide the layers)", ge=1,
                                            read_in=(MEGATRON,))
    virtual_pipeline_model_parallel_size: Optional[int] = key(None, "model chunks per pipeline rank (megatron's "
                                                              "interleaved layer assignment; null: 1); pipeline x "
                                                              "virtual sizes must divide the layers", ge=1,
                                                              read_in=(MEGATRON,))
    context_parallel_size: int = key(1, "context parallel size", ge=1, unsupported=NO_MEGATRON_CP)
    expert_model_parallel_size: int = key(1, "expert parallel size: the experts of a mixture-of-experts model split "
                                             "over this many ranks (must divide the experts; a dense model: 1)",
                                          ge=1, read_in=(MEGATRON,))
    sequence_parallel: bool = key(True, "Megatron sequence parallel (off when tensor_model_parallel_size=1)",
                                  read_in=(MEGATRON,))
    use_distributed_optimizer: bool = key(True, "shard the optimizer state over the data-parallel ranks",
                                          read_in=(MEGATRON,))
    param_offload: bool = key(False, "keep parameters in host memory", read_in=(MEGATRON,), cpu=HOST_ALREADY,
                              gpu=NO_MEGATRON_OFFLOAD, npu=NO_MEGATRON_OFFLOAD)
    grad_offload: bool = key(False, "keep gradients in host memory", read_in=(MEGATRON,), cpu=HOST_ALREADY,
                             gpu=NO_MEGATRON_OFFLOAD, npu=NO_MEGATRON_OFFLOAD)
    optimizer_offload: bool = key(False, "keep optimizer state in host memory", read_in=(MEGATRON,), cpu=HOST_ALREADY,
                                  gpu=NO_MEGATRON_OFFLOAD, npu=NO_MEGATRON_OFFLOAD)
    seed: int = key(42, "Megatron seed", ge=0, read_in=(MEGATRON,))
    use_dist_checkpointing: bool = key(False, "load the initial weights from a Megatron distributed checkpoint "
                                              "(dist_checkpointing_path) instead of model.path's HF weights; the "
                                              "tokenizer and HF config still come from model.path",
                                       read_in=(MEGATRON,))
    dist_checkpointing_path: Optional[str] = key(None, "that checkpoint's directory (python -m "
                                                       "verl.models.mcore.converter_hf_to_mcore writes one)",
                                                 read_in=(MEGATRON,))
    dist_checkpointing_prefix: str = key("", "key prefix inside that checkpoint (NeMo: module.)", read_in=(MEGATRON,))
    expert_tensor_parallel_size: Optional[int] = key(None, "expert tensor parallel size: each expert's matrices cut "
                                                           "over this many ranks (null: the tensor parallel size)",
                                                     ge=1, read_in=(MEGATRON,))
    use_mbridge: bool = key(False, "load HF weights through mbridge (verl); here the engine's own converter loads "
                                   "the same weights for either value", read_in=(MEGATRON,))
    vanilla_mbridge: bool = key(True, "mbridge variant (verl); the same weights load for either value",
                                read_in=(MEGATRON,))
    override_transformer_config: dict = key(TRANSFORMER_OVERRIDE_DEFAULTS,
                                            "free-form megatron-core TransformerConfig fields applied over the "
                                            "engine's (e.g. recompute_granularity=full; null entries are skipped); "
                                            "fields derived from the model and the sizes, and CUDA-only fusions on "
                                            "CPU, are refused; attention_backend (Transformer Engine's kernel "
                                            "choice) is checked and recorded: the engine's layers run megatron-core's "
                                            "own attention",
                                            read_in=(MEGATRON, "verl/models/mcore/model.py"))


# the reference's and the critic's megatron keys follow the actor's unless set (ppo_megatron_trainer.yaml)
FollowingMegatronConfig = following(MegatronConfig, "actor_rollout_ref.actor.megatron", "FollowingMegatronConfig")
