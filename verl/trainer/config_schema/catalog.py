"""The shipped yamls and the schema each one follows (used by the reference generator and the tests)."""

from __future__ import annotations

from dataclasses import dataclass, field

from verl.trainer.config_schema.offline import EvaluationConfig, GenerationConfig
from verl.trainer.config_schema.ppo import PPOTrainerConfig
from verl.trainer.config_schema.sft import SFTTrainerConfig
from verl.trainer.config_schema.sft_engine import SFTEngineTrainerConfig

__all__ = ["ShippedYaml", "SHIPPED"]


@dataclass(frozen=True)
class ShippedYaml:
    name: str  # config name under verl/trainer/config
    command: str
    schema: type
    defaults: dict = field(default_factory=dict)  # keys whose default this yaml sets differently from the schema's


SHIPPED = (
    ShippedYaml("ppo_trainer", "python -m verl.trainer.main_ppo", PPOTrainerConfig),
    ShippedYaml("ppo_megatron_trainer", "python -m verl.trainer.main_ppo --config-name ppo_megatron_trainer",
                PPOTrainerConfig, {"actor_rollout_ref.actor.strategy": "megatron", "critic.strategy": "megatron",
                                   "reward_model.strategy": "megatron"}),
    ShippedYaml("sft_trainer", "python -m verl.trainer.fsdp_sft_trainer", SFTTrainerConfig),
    ShippedYaml("sft_trainer_engine", "python -m verl.trainer.sft_trainer", SFTEngineTrainerConfig),
    ShippedYaml("generation", "python -m verl.trainer.main_generation", GenerationConfig),
    ShippedYaml("evaluation", "python -m verl.trainer.main_eval", EvaluationConfig),
)

