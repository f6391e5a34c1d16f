"""Interactions: a simulated user that answers the model between turns and can score and end the episode
(verl's ``BaseInteraction``). Configured by ``actor_rollout_ref.rollout.multi_turn.interaction_config_path``;
a row picks one with ``extra_info.interaction_kwargs.name``."""

from .base import BaseInteraction

__all__ = ["BaseInteraction"]
