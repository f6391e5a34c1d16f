"""Reward managers: turn a rollout batch into token-level scores with rule-based scorers.

Pick one with ``reward_model.reward_manager=<name>`` (or ``reward_manager.name``): ``naive`` (one by one),
``batch`` (one batched call), ``prime`` (process pool, per-sample timeout), ``dapo`` (overlong penalty).
Register your own with ``@register("name")`` on a subclass of ``AbstractRewardManager``.
"""

from verl.workers.reward_manager.registry import REWARD_MANAGER_REGISTRY, get_reward_manager_cls, register
from verl.workers.reward_manager.abstract import AbstractRewardManager, RewardSample
from verl.workers.reward_manager.naive import NaiveRewardManager
from verl.workers.reward_manager.batch import BatchRewardManager
from verl.workers.reward_manager.prime import PrimeRewardManager
from verl.workers.reward_manager.dapo import DAPORewardManager

__all__ = [
    "REWARD_MANAGER_REGISTRY", "register", "get_reward_manager_cls", "AbstractRewardManager", "RewardSample",
    "NaiveRewardManager", "BatchRewardManager", "PrimeRewardManager", "DAPORewardManager",
]
