"""Schema of ``one_step_off_ppo_trainer.yaml`` (``python -m verl.experimental.one_step_off_policy.main_ppo``): the PPO
trainer's config plus the top-level ``rollout`` section that sizes the rollout's own pool of processes."""

from __future__ import annotations

from dataclasses import dataclass

from verl.trainer.config_schema.ppo import PPOTrainerConfig
from verl.trainer.config_schema.spec import Section, key, section

HERE = "verl/experimental/one_step_off_policy/main_ppo.py"


@dataclass(frozen=True)
class RolloutPool(Section):
    """The top-level ``rollout`` section of this mode's yaml: the rollout's own pool of processes."""

    nnodes: int = key(1, "rollout pool: nodes", ge=1, read_in=(HERE,))
    n_gpus_per_node: int = key(1, "rollout pool: processes per node (on CPU a 'gpu' is a worker process)", ge=1,
                               read_in=(HERE,))
    overlap: bool = key(True, "generate the next batch while the current one trains (false: synchronous, on the "
                              "same two pools)", read_in=(HERE,))

    @property
    def spec(self) -> list[int]:
        return [self.n_gpus_per_node] * self.nnodes


@dataclass(frozen=True)
class OneStepOffConfig(PPOTrainerConfig):
    """``one_step_off_ppo_trainer.yaml``, typed: the PPO trainer's config plus the rollout pool."""

    rollout: RolloutPool = section(RolloutPool)
