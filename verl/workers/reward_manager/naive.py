"""``naive``: call ``compute_score`` once per sample, in order (verl's default reward manager)."""

from __future__ import annotations

from verl.workers.reward_manager.abstract import AbstractRewardManager, RewardSample
from verl.workers.reward_manager.registry import register


@register("naive")
class NaiveRewardManager(AbstractRewardManager):
    """Scores samples one at a time with ``compute_score(data_source=, solution_str=, ground_truth=,
    extra_info=)``; extra constructor kwargs are forwarded to every ``compute_score`` call."""

    def score_samples(self, samples: list[RewardSample]) -> list:
        return [self.compute_score(**s.score_kwargs(), **self.reward_kwargs) for s in samples]
