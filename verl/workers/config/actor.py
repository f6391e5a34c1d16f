"""verl's actor config classes, built on the schema's ``actor_rollout_ref.actor`` section."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import verl.trainer.config_schema.actor as schema
from verl.trainer.config_schema.engine import CheckpointConfig
from verl.trainer.config_schema.spec import key, section
from verl.workers.config.base import CheckedSection, rekey
from verl.workers.config.engine import FSDPEngineConfig, McoreEngineConfig
from verl.workers.config.optimizer import FSDPOptimizerConfig, McoreOptimizerConfig

__all__ = ["PolicyLossConfig", "RouterReplayConfig", "ActorConfig", "FSDPActorConfig", "McoreActorConfig"]

LOG_PROB_PASS = ("the actor's log-prob pass is sized by actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu "
                 "/ log_prob_max_token_len_per_gpu; leave the default")


@dataclass(frozen=True)
class PolicyLossConfig(schema.PolicyLossConfig, CheckedSection):
    """``actor.policy_loss``: which registered policy loss runs, and its parameters."""


@dataclass(frozen=True)
class RouterReplayConfig(schema.RouterReplayConfig, CheckedSection):
    """``actor.router_replay``: mixture-of-experts routing replay (``mode=R2`` on the Megatron engine; see
    ``verl.models.mcore.router_replay``)."""


@dataclass(frozen=True)
class _CheckedCheckpointConfig(CheckpointConfig, CheckedSection):
    """``<role>.checkpoint``: what a checkpoint holds and what resuming restores."""


@dataclass(frozen=True)
class ActorConfig(schema.ActorConfig, CheckedSection):
    """``actor_rollout_ref.actor``: the PPO update of the policy (keys, defaults and ranges of the yaml).

    ``engine`` is the engine section of the strategy (``fsdp_config``, or ``megatron`` for strategy=megatron);
    ``model_config`` and ``global_batch_info`` carry what verl's workers attach to the actor config."""

    ppo_infer_micro_batch_size_per_gpu: Optional[int] = key(None, "rows per micro-batch of the actor's log-prob "
                                                            "pass", ge=1, unsupported=LOG_PROB_PASS)
    ppo_infer_max_token_len_per_gpu: int = key(16384, "token budget of the actor's log-prob pass", ge=1,
                                               unsupported=LOG_PROB_PASS)
    use_rollout_log_probs: bool = key(False, "use the rollout engine's log-probs as old_log_probs",
                                      unsupported="set algorithm.rollout_correction.bypass_mode=true to take "
                                                  "old_log_probs from the rollout")
    load_weight: bool = key(True, "load the checkpoint's weights",
                            unsupported="the weights always load from actor_rollout_ref.model.path; leave true")
    profile: dict = key({}, "verl's older Megatron profiling settings",
                        unsupported="use <role>.profiler and global_profiler; leave it empty")
    model_config: Any = None
    global_batch_info: dict = field(default_factory=dict)
    policy_loss: PolicyLossConfig = section(PolicyLossConfig)
    router_replay: RouterReplayConfig = section(RouterReplayConfig)
    checkpoint: _CheckedCheckpointConfig = section(_CheckedCheckpointConfig)
    optim: FSDPOptimizerConfig = section(FSDPOptimizerConfig)
    fsdp_config: FSDPEngineConfig = section(FSDPEngineConfig)
    megatron: McoreEngineConfig = section(McoreEngineConfig, optional=True)

    @property
    def engine(self) -> Any:
        """The engine section of this actor's strategy."""
        return self.megatron if self.strategy == "megatron" else self.fsdp_config


@dataclass(frozen=True)
class FSDPActorConfig(ActorConfig):
    """The actor on the FSDP engine (strategy fsdp / fsdp2, or an engine registered with ``workers="fsdp"``)."""


@dataclass(frozen=True)
class McoreActorConfig(ActorConfig):
    """The actor on the Megatron engine (strategy=megatron; ``megatron`` holds the parallel sizes)."""

    strategy: str = rekey(schema.ActorConfig, "strategy", "megatron")
    optim: McoreOptimizerConfig = section(McoreOptimizerConfig)
