"""The config schema: one frozen dataclass per config section, the single source of key names, defaults, types,
valid ranges and support status, and the validators built on it.

- ``validate_ppo_config(config) -> PPOPlan`` (``ppo_trainer.yaml``), run by ``main_ppo`` before Ray starts;
- ``typed_ppo_config(config) -> PPOTrainerConfig``: the validated config as frozen typed objects;
- ``verl.trainer.sft.config.validate_sft_config`` (``sft_trainer.yaml``) uses :mod:`.sft`;
- ``python -m verl.trainer.config_schema.reference`` writes ``docs/config_reference.md``.
"""

from verl.trainer.config_schema.ppo import AlgorithmConfig, PPOTrainerConfig, TrainerConfig
from verl.trainer.config_schema.validate import (PPOPlan, _check_pf_ppo, adv_estimator_choices, need_critic,
                                                 policy_loss_choices, slow_half_precision_keys, typed_ppo_config,
                                                 validate_ppo_config, warn_slow_cpu_bf16)
from verl.utils.config import ConfigError

AlgoConfig = AlgorithmConfig  # the name this module exported before the schema was split into sections

__all__ = ["ConfigError", "PPOPlan", "PPOTrainerConfig", "TrainerConfig", "AlgoConfig", "AlgorithmConfig",
           "validate_ppo_config", "typed_ppo_config", "need_critic", "adv_estimator_choices", "policy_loss_choices",
           "slow_half_precision_keys", "warn_slow_cpu_bf16", "_check_pf_ppo"]
