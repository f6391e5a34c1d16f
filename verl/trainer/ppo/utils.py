"""Small driver-side helpers of the PPO trainer (kept out of ray_trainer.py so fit() stays readable), and the
``Role`` enum that maps worker roles onto resource pools (verl keeps it here; ``verl.single_controller.ray``
and ``verl.trainer.ppo.ray_trainer`` re-export it)."""

from __future__ import annotations

import json
import os
from enum import Enum
from typing import Any

import numpy as np
import torch

from verl.trainer.config_schema import need_critic
from verl.trainer.ppo.rollout_corr import entropy_metric, rollout_probs_diff_metrics

__all__ = ["Role", "WorkerType", "need_critic", "need_reference_policy", "need_reward_model",
           "rollout_probs_diff_metrics", "dump_generations", "entropy_metric"]


WorkerType = type  # a worker class (a subclass of verl.single_controller.base.Worker)


class Role(Enum):
    """The roles a trainer places on resource pools (``ResourcePoolManager.mapping``); subclass to add more."""

    Actor = 0
    Rollout = 1
    ActorRollout = 2
    Critic = 3
    RefPolicy = 4
    RewardModel = 5
    ActorRolloutRef = 6
    Env = 7

    def __str__(self) -> str:
        return _ROLE_STRINGS.get(self.name, self.name.lower())

    @classmethod
    def from_string(cls, name: str) -> "Role":
        """``"actor_rollout"`` -> ``Role.ActorRollout`` (the short names ``str(role)`` gives); ValueError otherwise."""
        for role in cls:
            if str(role) == name.lower():
                return role
        raise ValueError(f"No Role found for string: {name!r}; known: {[str(r) for r in cls]}")


_ROLE_STRINGS = {"Actor": "actor", "Rollout": "rollout", "ActorRollout": "actor_rollout", "Critic": "critic",
                 "RefPolicy": "ref", "RewardModel": "rm", "ActorRolloutRef": "actor_rollout_ref", "Env": "env"}


def need_reference_policy(role_worker_mapping: dict) -> bool:
    return Role.RefPolicy in role_worker_mapping


def need_reward_model(role_worker_mapping: dict) -> bool:
    return Role.RewardModel in role_worker_mapping


def _jsonable(value: Any) -> Any:
    if isinstance(value, (np.generic,)):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, torch.Tensor):
        return value.tolist()
    return value


def dump_generations(inputs: list[str], outputs: list[str], scores: list[float], extra: dict[str, list],
                     dump_path: str, step: int) -> str:
    """Write one JSON line per sample to ``<dump_path>/<step>.jsonl`` (trainer.rollout_data_dir /
    trainer.validation_data_dir)."""
    os.makedirs(dump_path, exist_ok=True)
    path = os.path.join(dump_path, f"{step}.jsonl")
    n = len(inputs)
    columns = {"input": inputs, "output": outputs, "score": scores, "step": [step] * n}
    columns.update({k: list(v) for k, v in extra.items() if len(v) == n})
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({k: _jsonable(v[i]) for k, v in columns.items()}, ensure_ascii=False, default=str) + "\n")
    return path
