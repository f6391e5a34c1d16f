"""verl's reward-model config classes, built on the schema's ``reward_model`` section."""

from __future__ import annotations

from dataclasses import dataclass

import verl.trainer.config_schema.critic as schema
from verl.trainer.config_schema.spec import section
from verl.workers.config.base import CheckedSection

__all__ = ["SandboxFusionConfig", "RewardModelConfig"]


@dataclass(frozen=True)
class SandboxFusionConfig(schema.SandboxFusionConfig, CheckedSection):
    """``reward_model.sandbox_fusion``: the code-execution settings of the code data sources."""


@dataclass(frozen=True)
class RewardModelConfig(schema.RewardModelConfig, CheckedSection):
    """``reward_model``: a learned sequence-classification reward model (off by default)."""

    sandbox_fusion: SandboxFusionConfig = section(SandboxFusionConfig)
