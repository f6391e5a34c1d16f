"""verl's typed config classes (``from verl.workers.config import FSDPActorConfig, RolloutConfig, ...``).

Each class is a frozen dataclass built on a section of the config schema (``verl/trainer/config_schema/``): the
same keys, defaults, ranges and documentation as the yaml, checked on construction. verl's fields that this build
does not implement are present and accepted at verl's default; another value raises ``ConfigError`` naming the key
and what is supported. Build them from a config node with ``verl.utils.config.omega_conf_to_dataclass(node)`` (the
class follows from the node's ``_target_`` or its place in the config, see :func:`config_class_for`) or with a
class: ``omega_conf_to_dataclass(config.actor_rollout_ref.actor, FSDPActorConfig)``.
"""

from __future__ import annotations

from typing import Any

from verl.workers.config import actor, critic, engine, model, optimizer, reward_model, rollout
from verl.workers.config.actor import ActorConfig, FSDPActorConfig, McoreActorConfig, PolicyLossConfig, RouterReplayConfig
from verl.workers.config.critic import CriticConfig, FSDPCriticConfig, FSDPCriticModelCfg, McoreCriticConfig
from verl.workers.config.engine import FSDPEngineConfig, McoreEngineConfig, TrainingWorkerConfig, VeOmniEngineConfig
from verl.workers.config.model import HFModelConfig
from verl.workers.config.optimizer import (CriticFSDPOptimizerConfig, CriticMcoreOptimizerConfig, FSDPOptimizerConfig,
                                           McoreOptimizerConfig, OptimizerConfig, VeOmniOptimizerConfig,
                                           build_optimizer)
from verl.workers.config.reward_model import RewardModelConfig, SandboxFusionConfig
from verl.workers.config.rollout import (AgentLoopConfig, CustomAsyncServerConfig, MultiTurnConfig, PrometheusConfig,
                                         RolloutConfig, SamplingConfig, ServerConfig, TraceConfig)

__all__ = (actor.__all__ + critic.__all__ + reward_model.__all__ + engine.__all__ + optimizer.__all__
           + rollout.__all__ + model.__all__ + ["config_class_for"])

# sections whose class does not depend on a strategy: the end of their dotted path -> class
_BY_PATH = {
    "actor_rollout_ref.rollout": RolloutConfig,
    "actor_rollout_ref.model": HFModelConfig,
    "reward_model": RewardModelConfig,
    "critic.model": FSDPCriticModelCfg,
    "reward_model.sandbox_fusion": SandboxFusionConfig,
    "rollout.val_kwargs": SamplingConfig,
    "rollout.multi_turn": MultiTurnConfig,
    "rollout.agent": AgentLoopConfig,
    "agent.custom_async_server": CustomAsyncServerConfig,
    "rollout.trace": TraceConfig,
    "rollout.prometheus": PrometheusConfig,
    "rollout.server": ServerConfig,
    "policy_loss": PolicyLossConfig,
    "router_replay": RouterReplayConfig,
    "fsdp_config": FSDPEngineConfig,
    "megatron": McoreEngineConfig,
}


def _strategy(node: Any) -> str:
    value = node.get("strategy") if hasattr(node, "get") else None
    return str(value) if value is not None else "fsdp"


def config_class_for(path: str, node: Any) -> type | None:
    """The class of the config section at the dotted ``path`` of a PPO config (``node`` is the section; its parent
    is read for an optimizer's strategy), or None for a section without one. The actor and reference map to
    ``McoreActorConfig`` with strategy=megatron, else ``FSDPActorConfig`` (the critic likewise)."""
    if path in ("actor_rollout_ref.actor", "actor_rollout_ref.ref"):
        return McoreActorConfig if _strategy(node) == "megatron" else FSDPActorConfig
    if path == "critic":
        return McoreCriticConfig if _strategy(node) == "megatron" else FSDPCriticConfig
    if path.endswith(".optim") or path == "optim":
        parent = node._get_parent() if hasattr(node, "_get_parent") else None
        megatron = parent is not None and _strategy(parent) == "megatron"
        if path.startswith("critic."):
            return CriticMcoreOptimizerConfig if megatron else CriticFSDPOptimizerConfig
        return McoreOptimizerConfig if megatron else FSDPOptimizerConfig
    for tail, cls in _BY_PATH.items():
        if path == tail or path.endswith("." + tail):
            return cls
    return None
