"""The typed sections each worker group reads, built once by the trainer and sent to its workers.

The trainer turns the section a worker group gets (``actor_rollout_ref``, ``critic`` or ``reward_model``) into the
typed classes of this package and fills in the one derived value the workers need from the driver: the LR
schedule's ``optim.total_training_steps`` (known once the data loader is built). The objects are frozen and travel
to the workers pickled, as ``typed=`` next to their ``config`` section. A worker constructed without them (research
code that builds one by hand) builds the same objects from ``config`` with the same functions.

    from verl.workers.config.roles import actor_rollout_ref_sections
    typed = actor_rollout_ref_sections(config.actor_rollout_ref, total_training_steps=100)
    typed.actor.optim.total_training_steps  # 100
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from collections.abc import Mapping
from typing import Any, Optional

from omegaconf import DictConfig

from verl.trainer.config_schema.actor import RefConfig
from verl.trainer.config_schema.ppo import ActorRolloutRefConfig
from verl.utils.config import omega_conf_to_dataclass
from verl.workers.config import config_class_for
from verl.workers.config.actor import ActorConfig
from verl.workers.config.critic import CriticConfig
from verl.workers.config.model import HFModelConfig
from verl.workers.config.reward_model import RewardModelConfig
from verl.workers.config.rollout import RolloutConfig

__all__ = ["typed_section", "child_section", "ActorRolloutRefSections", "actor_rollout_ref_sections", "critic_sections",
           "reward_model_sections"]


@dataclass(frozen=True)
class ActorRolloutRefSections:
    """``actor_rollout_ref``, typed: what the actor / rollout / reference worker reads.

    ``ref`` is the reference's engine settings typed as an actor of its strategy (the reference engine is built
    like the actor's); ``ref_log_prob`` is the same section's ``log_prob_*`` keys (the reference's forward pass)."""

    model: HFModelConfig
    actor: ActorConfig
    ref: ActorConfig
    ref_log_prob: RefConfig
    rollout: RolloutConfig
    nccl_timeout: int


def child_section(section: Any, name: str) -> Any:
    """The section ``name`` of a group of sections (a DictConfig or mapping, a typed object, or None)."""
    if isinstance(section, (DictConfig, Mapping)):
        return section.get(name)
    return getattr(section, name, None)


def _schema_default(cls: type, name: str) -> Any:
    return next(f.default for f in dataclasses.fields(cls) if f.name == name)


def typed_section(node: Any, path: str) -> Any:
    """``node`` (a Hydra/dict section, or None for all defaults) as the typed class of its place ``path`` in the
    PPO config (:func:`verl.workers.config.config_class_for`: ``actor_rollout_ref.actor`` -> ``FSDPActorConfig`` /
    ``McoreActorConfig`` by its strategy, ``critic``, ``reward_model``, ``actor_rollout_ref.model`` ...). An object
    that is already typed is returned as it is."""
    if dataclasses.is_dataclass(node) and not isinstance(node, type):
        return node
    return omega_conf_to_dataclass(node, config_class_for(path, node))


def _with_total_steps(role: Any, total_training_steps: Optional[int]) -> Any:
    """``role`` with ``optim.total_training_steps`` set (a new object; ``role`` is frozen and stays as it is)."""
    if total_training_steps is None:
        return role
    optim = dataclasses.replace(role.optim, total_training_steps=int(total_training_steps))
    return dataclasses.replace(role, optim=optim)


def actor_rollout_ref_sections(section: Any, total_training_steps: Optional[int] = None) -> ActorRolloutRefSections:
    """The ``actor_rollout_ref`` section (Hydra node or mapping) typed; ``total_training_steps`` fills the actor's
    ``optim.total_training_steps``."""
    if isinstance(section, ActorRolloutRefSections):
        return section
    actor = typed_section(child_section(section, "actor"), "actor_rollout_ref.actor")
    ref = child_section(section, "ref")
    timeout = child_section(section, "nccl_timeout")
    return ActorRolloutRefSections(
        model=typed_section(child_section(section, "model"), "actor_rollout_ref.model"),
        actor=_with_total_steps(actor, total_training_steps),
        ref=typed_section(ref, "actor_rollout_ref.actor"),
        ref_log_prob=ref if isinstance(ref, RefConfig) else omega_conf_to_dataclass(ref, RefConfig),
        rollout=typed_section(child_section(section, "rollout"), "actor_rollout_ref.rollout"),
        nccl_timeout=int(timeout) if timeout is not None else _schema_default(ActorRolloutRefConfig, "nccl_timeout"),
    )


def critic_sections(section: Any, total_training_steps: Optional[int] = None) -> CriticConfig:
    """The ``critic`` section typed as its strategy's class, ``optim.total_training_steps`` filled in."""
    return _with_total_steps(typed_section(section, "critic"), total_training_steps)


def reward_model_sections(section: Any) -> RewardModelConfig:
    """The ``reward_model`` section typed."""
    return typed_section(section, "reward_model")
