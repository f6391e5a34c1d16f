"""Typed, frozen engine configuration, built once from a role's typed config sections.

``EngineConfig`` is everything a training engine needs to build a model, its optimizer and LR schedule; the
``*_engine_config`` functions derive it for each role (actor, reference, critic, reward model) in one place, so a
worker never reads engine keys itself and never changes its config.

They take the role's sections as the typed classes of :mod:`verl.workers.config` (``FSDPActorConfig``,
``HFModelConfig``, ``FSDPCriticConfig``, ``RewardModelConfig`` ...) or as Hydra/dict sections, which are converted
once here with :func:`verl.utils.config.omega_conf_to_dataclass`. Every default is the schema's: a key the section
leaves out gets the value ``docs/config_reference.md`` lists.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from verl.trainer.config_schema.engine import CheckpointConfig
from verl.utils.chunked_head import DEFAULT_CHUNK_SIZE
from verl.utils.config import omega_conf_to_dataclass
from verl.utils.fs import copy_to_local
from verl.utils.torch_functional import ENTROPY_CHUNK_ROWS
from verl.workers.config import FSDPEngineConfig, FSDPOptimizerConfig
from verl.workers.config.roles import child_section, typed_section

__all__ = ["EngineConfig", "plain", "typed_section", "actor_engine_config", "ref_engine_config",
           "critic_engine_config", "reward_engine_config", "sft_engine_config", "training_worker_engine_config",
           "MODEL_KINDS"]

MODEL_KINDS = ("causal_lm", "value", "reward")
AR = "actor_rollout_ref"


def plain(value: Any) -> Any:
    """An OmegaConf node as plain Python containers (interpolations resolved); other values unchanged."""
    if isinstance(value, (DictConfig, ListConfig)):
        return OmegaConf.to_container(value, resolve=True)
    return value


def _fields(section: Any) -> dict:
    """A typed section's keys as a plain dict (nested sections as dicts), for engines that take mappings."""
    return {f.name: _plain_value(getattr(section, f.name)) for f in dataclasses.fields(section)}


def _plain_value(value: Any) -> Any:
    return _fields(value) if dataclasses.is_dataclass(value) and not isinstance(value, type) else value


@dataclass(frozen=True)
class EngineConfig:
    """What the engine builds (see ``FSDPEngine.build``).

    ``optim`` None means a frozen, forward-only model (reference policy, reward model); otherwise the role's
    typed optimizer section (``verl.workers.config.OptimizerConfig``). ``fsdp`` is the role's typed ``fsdp_config``
    section (``verl.workers.config.FSDPEngineConfig``: ``dtype`` / ``mixed_precision``, ``reshard_after_forward``,
    ``offload_policy``, ``wrap_policy``), or None for plain FSDP2 sharding in the loaded dtype; ``megatron`` the
    ``<role>.megatron`` keys as a dict. The defaults below are the engine's when it is built by hand (tests,
    research code); the builders below pass every field from the config.
    """

    model_path: str
    model_kind: str = "causal_lm"
    name: str = "engine"
    strategy: str = "fsdp"
    model_dtype: str = "fp32"
    override_config: dict | None = None
    trust_remote_code: bool = False
    enable_gradient_checkpointing: bool = False
    use_remove_padding: bool = False
    lora_rank: int = 0
    lora_alpha: float = 16
    target_modules: Any = "all-linear"
    exclude_modules: Any = None
    fsdp: Any = None
    param_offload: bool = False
    optimizer_offload: bool = False
    optim: Any = None
    total_training_steps: int = -1
    grad_clip: float | None = None
    checkpoint: Any = None
    seed: int = 42
    megatron: dict = field(default_factory=dict)  # <role>.megatron.* (strategy=megatron: parallel sizes)
    ulysses_sequence_parallel_size: int = 1  # ranks that split one packed sequence (FSDP engine)
    share_prompt_prefix: bool = False  # rows sharing a prompt computed as one packed row (FSDP engine)
    fused_chunk_size: int = 0  # model.use_fused_kernels: log-probs from hidden states in chunks of tokens (0: off)
    use_torch_compile: bool = False  # <role>.use_torch_compile: decoder layers compiled (verl.utils.compile)
    freeze_vision_tower: bool = False  # actor.freeze_vision_tower: a VLM's vision encoder gets no updates
    entropy_chunk_rows: int = 0  # <role>.entropy_from_logits_with_chunking: logit rows per entropy chunk (0: all)
    lora_adapter_path: str | None = None  # model.lora_adapter_path: a saved PEFT adapter trained further
    lora: dict = field(default_factory=dict)  # model.lora.* (strategy=megatron: LoRA on the tensor-parallel layers)
    # actor.router_replay.mode: R2 builds a mixture-of-experts model's routers able to record and replay their
    # top-k experts (Megatron engine; verl.models.mcore.router_replay); disabled otherwise
    router_replay: str = "disabled"

    def __post_init__(self):
        if self.model_kind not in MODEL_KINDS:
            raise ValueError(f"model_kind={self.model_kind!r} is not one of {MODEL_KINDS}")


COMPILE_KEYS = {"actor": f"{AR}.actor.use_torch_compile", "ref": f"{AR}.ref.use_torch_compile",
                "critic": "critic.model.fsdp_config.use_torch_compile"}


def compile_key(name: str) -> str:
    """The config key that turns compilation on or off for the engine called ``name`` (named in errors)."""
    return COMPILE_KEYS.get(name, "use_torch_compile")


def local_model_path(model: Any) -> str:
    """Where a role loads its weights from: ``model.path``, or with ``model.use_shm=True`` (verl's key) a copy of it
    in /dev/shm, made once per machine by whichever process asks first."""
    return copy_to_local(str(model.path), use_shm=bool(model.use_shm))


def _weights(model: Any, fsdp: Any) -> dict:
    """Where the weights come from and how they are loaded: ``model.path`` / ``override_config`` /
    ``trust_remote_code`` and the fsdp section's ``model_dtype`` / ``seed`` / offloading."""
    return dict(model_path=local_model_path(model), override_config=dict(model.override_config),
                trust_remote_code=bool(model.trust_remote_code), fsdp=fsdp,
                model_dtype=str(fsdp.model_dtype), seed=int(fsdp.seed),
                param_offload=bool(fsdp.param_offload), optimizer_offload=bool(fsdp.optimizer_offload))


def _grad_clip(role: Any) -> float:
    """``<role>.grad_clip``, or ``<role>.optim.clip_grad`` when it is null."""
    return float(role.grad_clip if role.grad_clip is not None else role.optim.clip_grad)


def _megatron(role: Any) -> dict:
    return _fields(role.megatron) if role.megatron is not None else {}


def _entropy_chunk_rows(role: Any) -> int:
    """``<role>.entropy_from_logits_with_chunking`` (or its ``fsdp_config`` spelling) -> rows per entropy chunk."""
    chunked = role.entropy_from_logits_with_chunking or role.fsdp_config.entropy_from_logits_with_chunking
    return ENTROPY_CHUNK_ROWS if chunked else 0


def _fused_chunk_size(fused: bool) -> int:
    """``use_fused_kernels`` -> tokens per chunk of the chunked output layer (0: the plain logits path)."""
    return DEFAULT_CHUNK_SIZE if fused else 0


def actor_engine_config(arr_cfg: Any) -> EngineConfig:
    """The trainable policy of ``actor_rollout_ref`` (``model`` + ``actor``)."""
    model = typed_section(child_section(arr_cfg, "model"), f"{AR}.model")
    actor = typed_section(child_section(arr_cfg, "actor"), f"{AR}.actor")
    return EngineConfig(
        name="actor", strategy=actor.strategy, model_kind="causal_lm",
        enable_gradient_checkpointing=model.enable_gradient_checkpointing,
        use_remove_padding=actor.use_remove_padding,  # the yaml's actor key follows model.use_remove_padding
        lora_rank=model.lora_rank, lora_alpha=float(model.lora_alpha), target_modules=model.target_modules,
        exclude_modules=model.exclude_modules,
        optim=actor.optim, total_training_steps=int(actor.optim.total_training_steps),
        grad_clip=_grad_clip(actor), checkpoint=actor.checkpoint, megatron=_megatron(actor),
        ulysses_sequence_parallel_size=actor.ulysses_sequence_parallel_size,
        share_prompt_prefix=model.share_prompt_prefix,
        fused_chunk_size=_fused_chunk_size(actor.use_fused_kernels),  # the actor's key follows the model's
        use_torch_compile=actor.use_torch_compile and actor.fsdp_config.use_torch_compile,
        freeze_vision_tower=actor.freeze_vision_tower, lora_adapter_path=model.lora_adapter_path,
        entropy_chunk_rows=_entropy_chunk_rows(actor), lora=_plain_value(model.lora),
        router_replay=str(actor.router_replay.mode),
        **_weights(model, actor.fsdp_config),
    )


def ref_engine_config(arr_cfg: Any) -> EngineConfig:
    """The frozen reference policy: ``model`` + ``ref`` (its ``fsdp_config``, sizes and compile switch); padding
    handling follows the actor."""
    model = typed_section(child_section(arr_cfg, "model"), f"{AR}.model")
    actor = typed_section(child_section(arr_cfg, "actor"), f"{AR}.actor")
    ref = typed_section(child_section(arr_cfg, "ref"), f"{AR}.ref")
    return EngineConfig(name="ref", strategy=ref.strategy, model_kind="causal_lm",
                        use_remove_padding=actor.use_remove_padding, megatron=_megatron(ref),
                        ulysses_sequence_parallel_size=ref.ulysses_sequence_parallel_size,
                        share_prompt_prefix=model.share_prompt_prefix,
                        fused_chunk_size=_fused_chunk_size(model.use_fused_kernels),
                        use_torch_compile=ref.use_torch_compile and ref.fsdp_config.use_torch_compile,
                        entropy_chunk_rows=_entropy_chunk_rows(ref),
                        **_weights(model, ref.fsdp_config))


def critic_engine_config(critic_cfg: Any) -> EngineConfig:
    """The value model of ``critic`` (``critic.model``, ``critic.optim``)."""
    critic = typed_section(critic_cfg, "critic")
    model = critic.model
    return EngineConfig(
        name="critic", strategy=critic.strategy, model_kind="value",
        enable_gradient_checkpointing=model.enable_gradient_checkpointing,
        use_remove_padding=model.use_remove_padding,
        lora_rank=model.lora_rank, lora_alpha=float(model.lora_alpha), target_modules=model.target_modules,
        optim=critic.optim, total_training_steps=int(critic.optim.total_training_steps),
        grad_clip=_grad_clip(critic), checkpoint=critic.checkpoint, megatron=_megatron(critic),
        ulysses_sequence_parallel_size=critic.ulysses_sequence_parallel_size,
        share_prompt_prefix=model.share_prompt_prefix,
        use_torch_compile=model.fsdp_config.use_torch_compile,
        **_weights(model, model.fsdp_config),
    )


def reward_engine_config(rm_cfg: Any) -> EngineConfig:
    """The frozen reward model of ``reward_model`` (a sequence classifier). Its ``fsdp_config`` leaves
    ``model_dtype`` and ``seed`` null by default: the weights load in fp32 with seed 42."""
    rm = typed_section(rm_cfg, "reward_model")
    model, fsdp = rm.model, rm.model.fsdp_config
    model_dtype = str(fsdp.model_dtype or "fp32")
    # the RM's section carries only some fsdp_config keys; it computes in the dtype it is loaded in
    sharding = FSDPEngineConfig(wrap_policy=fsdp.wrap_policy, reshard_after_forward=fsdp.reshard_after_forward,
                                forward_prefetch=fsdp.forward_prefetch, fsdp_size=fsdp.fsdp_size,
                                param_offload=fsdp.param_offload, model_dtype=model_dtype, dtype=model_dtype)
    return EngineConfig(name="reward_model", strategy=rm.strategy, model_kind="reward",
                        use_remove_padding=model.use_remove_padding,
                        model_path=local_model_path(model), override_config=dict(model.override_config),
                        trust_remote_code=bool(model.trust_remote_code), fsdp=sharding, model_dtype=model_dtype,
                        seed=int(fsdp.seed if fsdp.seed is not None else 42),
                        param_offload=bool(fsdp.param_offload),
                        megatron=_megatron(rm) if rm.strategy == "megatron" else {})


def sft_engine_config(sft_cfg: Any, model_path: str, total_training_steps: int) -> EngineConfig:
    """The model of ``sft_trainer.yaml`` (``model.*``, ``optim.*``, ``trainer.seed`` / ``checkpoint``), read as
    attributes (the composed yaml, or its typed form, carries every key with the schema's default).

    Padding is trimmed (``use_remove_padding``): the same loss as the full width, less compute.
    """
    model, optim, trainer = sft_cfg.model, sft_cfg.optim, sft_cfg.trainer
    fsdp = model.fsdp_config
    offload = bool(fsdp.cpu_offload or fsdp.offload_params)
    return EngineConfig(
        name="sft", strategy=str(model.strategy), model_kind="causal_lm", model_path=model_path,
        model_dtype=str(fsdp.model_dtype), trust_remote_code=bool(model.trust_remote_code),
        enable_gradient_checkpointing=bool(model.enable_gradient_checkpointing),
        use_remove_padding=True,
        lora_rank=int(model.lora_rank), lora_alpha=float(model.lora_alpha), target_modules=plain(model.target_modules),
        # a null compute dtype computes in model_dtype
        fsdp=FSDPEngineConfig(offload_policy=offload, model_dtype=fsdp.model_dtype,
                              dtype=fsdp.dtype or fsdp.model_dtype),
        optim=FSDPOptimizerConfig(lr=float(optim.lr), betas=list(plain(optim.betas)),
                                  weight_decay=float(optim.weight_decay),
                                  lr_warmup_steps_ratio=float(optim.lr_warmup_steps_ratio),
                                  lr_scheduler_type=str(optim.lr_scheduler)),
        total_training_steps=int(total_training_steps), grad_clip=float(optim.clip_grad),
        checkpoint=omega_conf_to_dataclass(trainer.checkpoint, CheckpointConfig), seed=int(trainer.seed),
    )


def training_worker_engine_config(worker: Any, total_training_steps: int,
                                  ulysses_sequence_parallel_size: int = 1) -> EngineConfig:
    """The trainable model of verl's ``TrainingWorkerConfig`` (``verl.workers.config``): its typed
    ``model_config`` (``HFModelConfig``), ``engine_config`` (``FSDPEngineConfig``), ``optimizer_config`` and
    ``checkpoint_config``, as verl 0.7's ``sft_trainer_engine.yaml`` gives them (``model.*``, ``engine.*``,
    ``optim.*``, ``checkpoint.*``). The engine section's Ulysses size is passed on its own: a PPO role's
    fsdp_config refuses it, the SFT trainer runs it."""
    model, fsdp, optim = worker.model_config, worker.engine_config, worker.optimizer_config
    return EngineConfig(
        name="sft", strategy=fsdp.strategy, model_kind="causal_lm",
        enable_gradient_checkpointing=model.enable_gradient_checkpointing, use_remove_padding=model.use_remove_padding,
        lora_rank=model.lora_rank, lora_alpha=float(model.lora_alpha), target_modules=model.target_modules,
        exclude_modules=model.exclude_modules, lora_adapter_path=model.lora_adapter_path,
        optim=optim, total_training_steps=int(total_training_steps), grad_clip=float(optim.clip_grad),
        checkpoint=worker.checkpoint_config, ulysses_sequence_parallel_size=int(ulysses_sequence_parallel_size),
        fused_chunk_size=_fused_chunk_size(model.use_fused_kernels), use_torch_compile=fsdp.use_torch_compile,
        **_weights(model, fsdp),
    )
