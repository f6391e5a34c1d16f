"""The config schema: one frozen dataclass per config section, the single source of key names, defaults, types,
valid ranges and support status, and the validators built on it.

- ``validate_ppo_config(config) -> PPOPlan`` (``ppo_trainer.yaml``), run by ``main_ppo`` before Ray starts;
- ``typed_ppo_config(config) -> PPOTrainerConfig``: the validated config as frozen typed objects;
- ``verl.trainer.sft.config.validate_sft_config`` (``sft_trainer.yaml``) uses :mod:`.sft`;
- ``python -m verl.trainer.config_schema.reference`` writes ``docs/config_reference.md``.
"""

from __future__ import annotations

from verl.utils.config import ConfigError
from verl.utils.import_utils import lazy_exports

# names -> submodule, imported on first use (PEP 562): importing one section module (``.actor`` for
# verl.workers.config) does not load the validator and what it imports (the trainer's algorithms, agent loops)
_LAZY = {"AlgorithmConfig": "ppo", "PPOTrainerConfig": "ppo", "TrainerConfig": "ppo", "PPOPlan": "validate",
         "_check_pf_ppo": "validate", "adv_estimator_choices": "validate", "need_critic": "validate",
         "policy_loss_choices": "validate", "slow_half_precision_keys": "validate", "typed_ppo_config": "validate",
         "validate_ppo_config": "validate", "warn_slow_cpu_bf16": "validate"}
_ALIASES = {"AlgoConfig": "AlgorithmConfig"}  # the name this module exported before the schema was split

__all__ = ["ConfigError", "PPOPlan", "PPOTrainerConfig", "TrainerConfig", "AlgoConfig", "AlgorithmConfig",
           "validate_ppo_config", "typed_ppo_config", "need_critic", "adv_estimator_choices", "policy_loss_choices",
           "slow_half_precision_keys", "warn_slow_cpu_bf16", "_check_pf_ppo"]


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, _ALIASES)
