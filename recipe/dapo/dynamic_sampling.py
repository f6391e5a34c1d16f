"""DAPO's dynamic sampling (Yu et al., 2025, "DAPO", section 3.2): keep only the groups that carry a learning signal.

With group-normalised advantages (GRPO), a prompt whose ``rollout.n`` responses all get the same value of the
filter metric (all correct or all wrong) has zero advantage everywhere and contributes no gradient. Dynamic
sampling drops such groups and keeps generating rounds of ``data.gen_batch_size`` prompts until
``data.train_batch_size`` prompts' groups are collected; the surplus of the last round is cut off.

``algorithm.filter_groups.metric`` names the per-response value compared inside a group:

- ``acc`` / ``score``: the reward function's own per-sample values (``reward_extra_info``: the ``dapo`` reward
  manager reports both; ``score`` is the rule score before the overlong penalty). A manager that reports no
  ``score`` falls back to ``seq_reward``;
- ``seq_reward``: the sum of the token-level scores (the score plus any overlong penalty);
- ``seq_final_reward``: the sum of the token-level rewards; without a KL penalty in the reward (the only case
  the recipe accepts for this metric) it equals ``seq_reward``.

This module is pure logic over :class:`verl.protocol.DataProto` batches, so it is tested without workers.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from verl.utils.config import ConfigError

if TYPE_CHECKING:  # annotations only: the DAPO entry point checks configs without loading tensordict
    from verl.protocol import DataProto

FILTER_METRICS = ("acc", "score", "seq_reward", "seq_final_reward")


class DynamicSamplingError(RuntimeError):
    """``algorithm.filter_groups.max_num_gen_batches`` rounds did not collect a full batch."""


def sequence_metric(batch: DataProto, metric: str) -> np.ndarray:
    """The filter metric of every response in ``batch`` (float64, one value per row)."""
    if metric in ("seq_reward", "seq_final_reward"):
        key = "token_level_scores" if metric == "seq_reward" else "token_level_rewards"
        if key not in batch.batch.keys():
            key = "token_level_scores"  # rewards are set after filtering; without KL in the reward they are equal
        return batch.batch[key].sum(dim=-1).double().numpy()
    if metric in batch.non_tensor_batch:
        return np.asarray(batch.non_tensor_batch[metric], dtype=np.float64)
    if metric == "score":
        return sequence_metric(batch, "seq_reward")
    raise ValueError(
        f"algorithm.filter_groups.metric={metric!r}: the reward function reported no per-sample {metric!r} "
        f"(reported: {sorted(k for k in batch.non_tensor_batch if k not in ('uid', 'data_source'))}). Use "
        "reward_model.reward_manager=dapo (it reports acc and score) or algorithm.filter_groups.metric=seq_reward")


def informative_groups(uids: np.ndarray, values: np.ndarray) -> tuple[list, list]:
    """(kept uids, dropped uids) in order of first appearance: a group is kept when its values are not all equal
    (standard deviation > 0); a group of a single response is kept, as in verl."""
    groups: OrderedDict = OrderedDict()
    for uid, value in zip(uids, values):
        groups.setdefault(uid, []).append(float(value))
    kept = [u for u, vals in groups.items() if len(vals) == 1 or np.std(vals) > 0]
    dropped = [u for u in groups if u not in set(kept)]
    return kept, dropped


@dataclass
class DynamicSampler:
    """Accumulates the informative groups of successive generation rounds until ``train_batch_size`` prompts'
    groups are there.

    ``add(round_batch)`` filters one scored round (rows grouped by ``uid``, ``n`` per prompt) and returns True
    once the batch is full; it raises :class:`DynamicSamplingError` naming ``algorithm.filter_groups.max_num_gen_batches``
    when that many rounds (> 0) did not fill it. ``batch()`` is the kept rows, cut to ``train_batch_size * n``.
    """

    train_batch_size: int
    n: int
    metric: str
    max_num_gen_batches: int = 0
    num_gen_batches: int = 0
    kept_groups: int = 0
    dropped_groups: int = 0
    _parts: list = field(default_factory=list)
    _score_sum: float = 0.0
    _responses: int = 0

    def add(self, round_batch: DataProto) -> bool:
        self.num_gen_batches += 1
        uids = round_batch.non_tensor_batch["uid"]
        kept, dropped = informative_groups(uids, sequence_metric(round_batch, self.metric))
        self.kept_groups += len(kept)
        self.dropped_groups += len(dropped)
        self._score_sum += float(round_batch.batch["token_level_scores"].sum().double())
        self._responses += len(round_batch)
        keep = set(kept)
        rows = [i for i, uid in enumerate(uids) if uid in keep]
        if rows:
            self._parts.append(round_batch.select_idxs(np.asarray(rows, dtype=np.int64)))
        if self.full:
            return True
        if 0 < self.max_num_gen_batches <= self.num_gen_batches:
            raise DynamicSamplingError(
                f"dynamic sampling kept {self.kept_groups} of the {self.train_batch_size} prompt groups a step needs "
                f"after {self.num_gen_batches} generation rounds (algorithm.filter_groups.max_num_gen_batches="
                f"{self.max_num_gen_batches}); {self.dropped_groups} groups had the same "
                f"algorithm.filter_groups.metric={self.metric!r} for every response. Raise "
                "algorithm.filter_groups.max_num_gen_batches (<= 0: no limit) or data.gen_batch_size, or use "
                "harder/easier prompts so that fewer groups are all correct or all wrong")
        return False

    @property
    def full(self) -> bool:
        return self.kept_groups >= self.train_batch_size

    def batch(self) -> DataProto:
        """The kept responses of the first ``train_batch_size`` kept prompts (whole groups, in order)."""
        if not self.full:
            raise RuntimeError(f"only {self.kept_groups} of {self.train_batch_size} prompt groups collected")
        for part in self._parts[1:]:
            part.meta_info = {}  # per-round bookkeeping; the step's batch keeps the first round's
        merged = self._parts[0] if len(self._parts) == 1 else type(self._parts[0]).concat(self._parts)
        return merged.slice(0, self.train_batch_size * self.n)

    def metrics(self) -> dict:
        """Rounds, kept/dropped groups and ``train/gen_score/mean``: the mean sequence score of every generated
        response (``critic/score/mean`` covers only the kept groups, so it is not the policy's success rate)."""
        return {"train/num_gen_batches": self.num_gen_batches, "train/kept_groups": self.kept_groups,
                "train/dropped_groups": self.dropped_groups,
                "train/gen_score/mean": self._score_sum / max(self._responses, 1)}


def check_filter_groups(metric, max_num_gen_batches, n: int, use_kl_in_reward: bool) -> None:
    """Config rules of ``algorithm.filter_groups`` when it is enabled (errors name the key and a value that works)."""
    if metric is None:
        raise ConfigError("algorithm.filter_groups.enable=True needs algorithm.filter_groups.metric: one of "
                          + ", ".join(FILTER_METRICS) + " (acc: the share of correct answers, as in the DAPO paper)")
    if metric not in FILTER_METRICS:
        raise ConfigError(f"algorithm.filter_groups.metric={metric!r} is not one of: " + ", ".join(FILTER_METRICS))
    if isinstance(max_num_gen_batches, bool) or not isinstance(max_num_gen_batches, int):
        raise ConfigError(f"algorithm.filter_groups.max_num_gen_batches={max_num_gen_batches!r} must be an integer "
                          "(<= 0: no limit)")
    if n < 2:
        raise ConfigError(f"algorithm.filter_groups.enable=True compares the responses of a prompt, but "
                          f"actor_rollout_ref.rollout.n={n}; set rollout.n >= 2 (DAPO uses 16)")
    if metric == "seq_final_reward" and use_kl_in_reward:
        raise ConfigError("algorithm.filter_groups.metric=seq_final_reward with algorithm.use_kl_in_reward=True: the "
                          "KL-shaped reward needs reference log-probs, which are computed after filtering; use "
                          "metric=seq_reward (or acc/score)")
