"""The actor interface the workers program against."""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from verl.protocol import DataProto


class BasePPOActor(ABC):
    """A policy that can score sequences and take PPO updates.

    ``config`` is the ``actor_rollout_ref.actor`` (or ``.ref``) subtree: an OmegaConf node, dict or dataclass.
    """

    def __init__(self, config):
        self.config = config

    @abstractmethod
    def compute_log_prob(self, data: DataProto, calculate_entropy: bool = False
                         ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Log-probabilities (B, R) of ``data.batch["responses"]`` (and entropies (B, R) if asked)."""

    @abstractmethod
    def update_policy(self, data: DataProto) -> dict:
        """One PPO update over ``data``; returns metrics ``{name: list of floats}``."""
