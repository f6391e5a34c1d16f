"""verl's optimizer config classes, built on the schema's ``*.optim`` section (one set of defaults and ranges)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Optional

from verl.trainer.config_schema.engine import LR_SCHEDULERS, CriticOptimConfig, OptimConfig
from verl.trainer.config_schema.spec import key
from verl.utils.config import ConfigError
from verl.workers.config.base import CheckedSection, rekey

__all__ = ["OptimizerConfig", "FSDPOptimizerConfig", "McoreOptimizerConfig", "build_optimizer",
           "VeOmniOptimizerConfig"]

HERE = "verl/workers/config/optimizer.py"
NO_VEOMNI = "the VeOmni engine is not available; use FSDPOptimizerConfig (strategy fsdp / fsdp2) or McoreOptimizerConfig"


@dataclass(frozen=True)
class OptimizerConfig(OptimConfig, CheckedSection):
    """``<role>.optim``: optimizer and learning-rate schedule (the keys and defaults of the yaml)."""

    # set by the trainer from trainer.total_training_steps when it builds the role's config (a yaml value is refused)
    total_training_steps: int = key(-1, "steps of the LR schedule (the trainer fills it in)", ge=1, also=(-1,),
                                    also_doc="not known yet", read_in=("verl/utils/fsdp_utils.py",))
    grad_clip: Optional[float] = key(None, "deprecated alias of clip_grad (wins when set)", ge=0, read_in=(HERE,))

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.grad_clip is not None:
            object.__setattr__(self, "clip_grad", float(self.grad_clip))
        if self.warmup_style is not None:  # verl's older name of lr_scheduler_type
            object.__setattr__(self, "lr_scheduler_type", self.warmup_style)


@dataclass(frozen=True)
class FSDPOptimizerConfig(OptimizerConfig):
    """The optimizer of the FSDP engine: ``optimizer`` from ``optimizer_impl`` (torch.optim, torchao.optim,
    bitsandbytes.optim ...) with ``override_optimizer_config`` as extra keyword arguments."""


@dataclass(frozen=True)
class CriticFSDPOptimizerConfig(FSDPOptimizerConfig):
    """``critic.optim``: the value model's default learning rate is the schema's critic one."""

    lr: float = rekey(CriticOptimConfig, "lr", 1e-5)


@dataclass(frozen=True)
class McoreOptimizerConfig(OptimizerConfig):
    """The optimizer of the Megatron engine. verl's Megatron scheduler keys are accepted at their defaults."""

    # the scheduler keys verl's McoreOptimizerConfig carries come from the schema (accepted at their defaults)


@dataclass(frozen=True)
class VeOmniOptimizerConfig(OptimizerConfig):
    """verl's VeOmni optimizer settings. Not available: constructing one raises ConfigError."""

    optimizer: str = key("adamw", "optimizer name", unsupported=NO_VEOMNI)
    lr_min: float = key(0.0, "minimum learning rate", unsupported=NO_VEOMNI)
    lr_start: float = key(0.0, "learning rate at the start of warm-up", unsupported=NO_VEOMNI)
    lr_decay_ratio: float = key(1.0, "decay ratio", unsupported=NO_VEOMNI)
    lr_scheduler_type: str = key("constant", "constant | cosine", choices=LR_SCHEDULERS, unsupported=NO_VEOMNI)

    def __post_init__(self) -> None:
        raise ConfigError(f"VeOmniOptimizerConfig: {NO_VEOMNI}")


def build_optimizer(parameters: Iterable[Any], config: OptimizerConfig):
    """The optimizer ``config`` describes over ``parameters`` (``optimizer`` from ``optimizer_impl`` with lr,
    weight decay, Adam betas and ``override_optimizer_config``); the FSDP engine builds its optimizer the same
    way."""
    # optional heavy dependency: torch's FSDP utilities load only when an optimizer is built
    from verl.utils.fsdp_utils import build_optimizer as build

    return build(parameters, config)


@dataclass(frozen=True)
class CriticMcoreOptimizerConfig(McoreOptimizerConfig):
    """``critic.optim`` on the Megatron engine (the critic's default learning rate)."""

    lr: float = rekey(CriticOptimConfig, "lr", 1e-5)
