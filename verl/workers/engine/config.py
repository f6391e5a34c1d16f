"""Typed, frozen engine configuration, built once from a role's section of the Hydra config.

``EngineConfig`` is everything a training engine needs to build a model, its optimizer and LR schedule; the
``*_engine_config`` functions read verl's keys for each role (actor, reference, critic, reward model) in one
place, so a worker never reads engine keys itself and never changes its config.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from verl.utils.chunked_head import DEFAULT_CHUNK_SIZE
from verl.utils.config import cfg_get

__all__ = ["EngineConfig", "plain", "actor_engine_config", "ref_engine_config", "critic_engine_config",
           "reward_engine_config", "sft_engine_config", "MODEL_KINDS"]

MODEL_KINDS = ("causal_lm", "value", "reward")


def plain(value: Any) -> Any:
    """An OmegaConf node as plain Python containers (interpolations resolved); other values unchanged."""
    if isinstance(value, (DictConfig, ListConfig)):
        return OmegaConf.to_container(value, resolve=True)
    return value



@dataclass(frozen=True)
class EngineConfig:
    """What the engine builds (see ``FSDPEngine.build``).

    ``optim`` None means a frozen, forward-only model (reference policy, reward model). ``fsdp`` holds the
    sharding keys of ``fsdp_config`` (``dtype`` / ``mixed_precision``, ``reshard_after_forward``,
    ``offload_policy``, ``wrap_policy``, ``fsdp_size``).
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
    fsdp: dict = field(default_factory=dict)
    param_offload: bool = False
    optimizer_offload: bool = False
    optim: dict | None = None
    total_training_steps: int = -1
    grad_clip: float | None = None
    checkpoint: dict | None = None
    seed: int = 42
    megatron: dict = field(default_factory=dict)  # <role>.megatron.* (strategy=megatron: parallel sizes)
    ulysses_sequence_parallel_size: int = 1  # ranks that split one packed sequence (FSDP engine)
    share_prompt_prefix: bool = False  # rows sharing a prompt computed as one packed row (FSDP engine)
    fused_chunk_size: int = 0  # model.use_fused_kernels: log-probs from hidden states in chunks of tokens (0: off)
    use_torch_compile: bool = False  # <role>.use_torch_compile: decoder layers compiled (verl.utils.compile)

    def __post_init__(self):
        if self.model_kind not in MODEL_KINDS:
            raise ValueError(f"model_kind={self.model_kind!r} is not one of {MODEL_KINDS}")


COMPILE_KEYS = {"actor": "actor_rollout_ref.actor.use_torch_compile", "ref": "actor_rollout_ref.ref.use_torch_compile",
                "critic": "critic.model.fsdp_config.use_torch_compile"}


def compile_key(name: str) -> str:
    """The config key that turns compilation on or off for the engine called ``name`` (named in errors)."""
    return COMPILE_KEYS.get(name, "use_torch_compile")


def _use_torch_compile(role_cfg: Any, fsdp_cfg: Any) -> bool:
    """``<role>.use_torch_compile`` and ``<role>...fsdp_config.use_torch_compile`` (verl's two keys; either False
    runs the model eagerly). Absent keys mean eager: the driver resolves verl's default for the host first."""
    role = cfg_get(role_cfg, "use_torch_compile", None) if role_cfg is not None else None
    engine = cfg_get(fsdp_cfg, "use_torch_compile", None) if fsdp_cfg is not None else None
    values = [bool(v) for v in (role, engine) if v is not None]
    return bool(values) and all(values)


def _fsdp_section(fsdp_cfg: Any) -> dict:
    return plain(fsdp_cfg) or {}


def _common(model_cfg: Any, fsdp_cfg: Any, **kwargs) -> dict:
    fsdp = _fsdp_section(fsdp_cfg)
    return dict(
        model_path=str(cfg_get(model_cfg, "path")),
        model_dtype=str(fsdp.get("model_dtype") or "fp32"),
        override_config=plain(cfg_get(model_cfg, "override_config")),
        trust_remote_code=bool(cfg_get(model_cfg, "trust_remote_code", False)),
        fsdp=fsdp,
        param_offload=bool(fsdp.get("param_offload", False)),
        optimizer_offload=bool(fsdp.get("optimizer_offload", False)),
        seed=int(fsdp.get("seed") if fsdp.get("seed") is not None else 42),
        **kwargs,
    )


def _grad_clip(role_cfg: Any) -> float | None:
    value = cfg_get(role_cfg, "grad_clip")
    if value is None:
        value = cfg_get(role_cfg, "optim.clip_grad")
    return None if value is None else float(value)


def _sp_size(role_cfg: Any, default: int = 1) -> int:
    """``<role>.ulysses_sequence_parallel_size`` (verl also accepts it under ``fsdp_config``)."""
    value = cfg_get(role_cfg, "ulysses_sequence_parallel_size")
    if value is None:
        value = cfg_get(role_cfg, "fsdp_config.ulysses_sequence_parallel_size", default)
    return int(value)


def _fused_chunk_size(model_cfg: Any, role_cfg: Any = None) -> int:
    """``<role>.use_fused_kernels`` (else ``model.use_fused_kernels``; ``fused_kernel_options.impl_backend`` torch)
    -> tokens per chunk of the chunked output layer (0: the plain logits path)."""
    fused = cfg_get(role_cfg, "use_fused_kernels", None) if role_cfg is not None else None
    if fused is None:
        fused = cfg_get(model_cfg, "use_fused_kernels", False)
    return DEFAULT_CHUNK_SIZE if bool(fused) else 0


def actor_engine_config(arr_cfg: Any) -> EngineConfig:
    """The trainable policy of ``actor_rollout_ref`` (``model.*`` + ``actor.*``)."""
    model, actor = cfg_get(arr_cfg, "model"), cfg_get(arr_cfg, "actor")
    optim = plain(cfg_get(actor, "optim")) or {}
    return EngineConfig(
        name="actor", strategy=str(cfg_get(actor, "strategy", "fsdp")), model_kind="causal_lm",
        enable_gradient_checkpointing=bool(cfg_get(model, "enable_gradient_checkpointing", False)),
        use_remove_padding=bool(cfg_get(actor, "use_remove_padding", cfg_get(model, "use_remove_padding", False))),
        lora_rank=int(cfg_get(model, "lora_rank", 0) or 0), lora_alpha=float(cfg_get(model, "lora_alpha", 16)),
        target_modules=plain(cfg_get(model, "target_modules", "all-linear")),
        exclude_modules=plain(cfg_get(model, "exclude_modules")),
        optim=optim, total_training_steps=int(optim.get("total_training_steps") or -1),
        grad_clip=_grad_clip(actor), checkpoint=plain(cfg_get(actor, "checkpoint")),
        megatron=plain(cfg_get(actor, "megatron")) or {},
        ulysses_sequence_parallel_size=_sp_size(actor),
        share_prompt_prefix=bool(cfg_get(model, "share_prompt_prefix", False)),
        fused_chunk_size=_fused_chunk_size(model, actor),
        use_torch_compile=_use_torch_compile(actor, cfg_get(actor, "fsdp_config")),
        **_common(model, cfg_get(actor, "fsdp_config")),
    )


def ref_engine_config(arr_cfg: Any) -> EngineConfig:
    """The frozen reference policy: ``model.*`` + ``ref.fsdp_config``; padding handling follows the actor."""
    model, actor, ref = cfg_get(arr_cfg, "model"), cfg_get(arr_cfg, "actor"), cfg_get(arr_cfg, "ref")
    remove_padding = cfg_get(ref, "use_remove_padding", cfg_get(actor, "use_remove_padding",
                                                          cfg_get(model, "use_remove_padding", False)))
    return EngineConfig(name="ref", strategy=str(cfg_get(ref, "strategy", "fsdp")), model_kind="causal_lm",
                        use_remove_padding=bool(remove_padding), megatron=plain(cfg_get(ref, "megatron")) or {},
                        ulysses_sequence_parallel_size=_sp_size(ref, _sp_size(actor)),
                        share_prompt_prefix=bool(cfg_get(model, "share_prompt_prefix", False)),
                        fused_chunk_size=_fused_chunk_size(model),
                        use_torch_compile=_use_torch_compile(ref, cfg_get(ref, "fsdp_config")),
                        **_common(model, cfg_get(ref, "fsdp_config")))


def critic_engine_config(critic_cfg: Any) -> EngineConfig:
    """The value model of ``critic`` (``critic.model.*``, ``critic.optim``)."""
    model = cfg_get(critic_cfg, "model")
    optim = plain(cfg_get(critic_cfg, "optim")) or {}
    remove_padding = cfg_get(critic_cfg, "use_remove_padding", cfg_get(model, "use_remove_padding", False))
    return EngineConfig(
        name="critic", strategy=str(cfg_get(critic_cfg, "strategy", "fsdp")), model_kind="value",
        enable_gradient_checkpointing=bool(cfg_get(model, "enable_gradient_checkpointing", False)),
        use_remove_padding=bool(remove_padding),
        lora_rank=int(cfg_get(model, "lora_rank", 0) or 0), lora_alpha=float(cfg_get(model, "lora_alpha", 16)),
        target_modules=plain(cfg_get(model, "target_modules", "all-linear")),
        optim=optim, total_training_steps=int(optim.get("total_training_steps") or -1),
        grad_clip=_grad_clip(critic_cfg), checkpoint=plain(cfg_get(critic_cfg, "checkpoint")),
        megatron=plain(cfg_get(critic_cfg, "megatron")) or {},
        ulysses_sequence_parallel_size=_sp_size(critic_cfg),
        use_torch_compile=_use_torch_compile(None, cfg_get(model, "fsdp_config")),
        **_common(model, cfg_get(model, "fsdp_config")),
    )


def reward_engine_config(rm_cfg: Any) -> EngineConfig:
    """The frozen reward model of ``reward_model`` (a sequence classifier)."""
    model = cfg_get(rm_cfg, "model")
    return EngineConfig(name="reward_model", strategy=str(cfg_get(rm_cfg, "strategy", "fsdp")), model_kind="reward",
                        use_remove_padding=bool(cfg_get(model, "use_remove_padding", False)),
                        megatron=plain(cfg_get(rm_cfg, "megatron")) or {}, **_common(model, cfg_get(model, "fsdp_config")))


def sft_engine_config(sft_cfg: Any, model_path: str, total_training_steps: int) -> EngineConfig:
    """The model of ``sft_trainer.yaml`` (``model.*``, ``optim.*``, ``trainer.seed``/``checkpoint``).

    Padding is trimmed (``use_remove_padding``): the same loss as the full width, less compute.
    """
    model, optim = cfg_get(sft_cfg, "model"), cfg_get(sft_cfg, "optim")
    fsdp = _fsdp_section(cfg_get(model, "fsdp_config"))
    offload = bool(fsdp.get("cpu_offload", False) or fsdp.get("offload_params", False))
    return EngineConfig(
        name="sft", strategy=str(cfg_get(model, "strategy", "fsdp2")), model_kind="causal_lm", model_path=model_path,
        model_dtype=str(fsdp.get("model_dtype") or "fp32"), trust_remote_code=bool(cfg_get(model, "trust_remote_code", False)),
        enable_gradient_checkpointing=bool(cfg_get(model, "enable_gradient_checkpointing", False)),
        use_remove_padding=True,
        lora_rank=int(cfg_get(model, "lora_rank", 0) or 0), lora_alpha=float(cfg_get(model, "lora_alpha", 16)),
        target_modules=plain(cfg_get(model, "target_modules", "all-linear")),
        fsdp={"offload_policy": offload, **({"dtype": fsdp["dtype"]} if fsdp.get("dtype") else {})},
        optim={"lr": float(cfg_get(optim, "lr")), "betas": list(plain(cfg_get(optim, "betas", [0.9, 0.95]))),
               "weight_decay": float(cfg_get(optim, "weight_decay", 0.01)),
               "lr_warmup_steps_ratio": float(cfg_get(optim, "lr_warmup_steps_ratio", 0.0)),
               "lr_scheduler_type": str(cfg_get(optim, "lr_scheduler", "cosine"))},
        total_training_steps=int(total_training_steps), grad_clip=float(cfg_get(optim, "clip_grad", 1.0)),
        checkpoint=plain(cfg_get(sft_cfg, "trainer.checkpoint")), seed=int(cfg_get(sft_cfg, "trainer.seed", 1)),
    )
