"""The critic interface the workers program against."""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from verl.protocol import DataProto


class BasePPOCritic(ABC):
    """A value function over response tokens. ``config`` is the ``critic`` subtree (OmegaConf, dict or dataclass)."""

    def __init__(self, config):
        self.config = config

    @abstractmethod
    def compute_values(self, data: DataProto) -> torch.Tensor:
        """Values (B, R) of the states before each response token, 0 outside ``response_mask``."""

    @abstractmethod
    def update_critic(self, data: DataProto) -> dict:
        """Value-function update over ``data``; returns metrics ``{name: list of floats}``."""
