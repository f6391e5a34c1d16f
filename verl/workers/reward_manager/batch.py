"""``batch``: one ``compute_score`` call for the whole batch (e.g. a scorer that queries a server)."""

from __future__ import annotations

from verl.utils.reward_score import default_compute_score, is_default_scorer
from verl.workers.reward_manager.abstract import AbstractRewardManager, RewardSample
from verl.workers.reward_manager.registry import register


def _per_sample(compute_score):
    """Adapts a one-sample scorer (the default) to the batched calling convention."""

    def batched(data_sources, solution_strs, ground_truths, extra_infos, **kwargs):
        return [compute_score(data_source=d, solution_str=s, ground_truth=g, extra_info=e, **kwargs)
                for d, s, g, e in zip(data_sources, solution_strs, ground_truths, extra_infos)]

    return batched


@register("batch")
class BatchRewardManager(AbstractRewardManager):
    """Calls ``compute_score(data_sources=[...], solution_strs=[...], ground_truths=[...], extra_infos=[...],
    **reward_kwargs)`` once and expects a list with one float (or dict with ``score``) per sample.
    Without a custom function the built-in per-sample scorer is applied to each element."""

    def __init__(self, tokenizer, num_examine=0, compute_score=None, reward_fn_key="data_source", **reward_kwargs):
        super().__init__(tokenizer, num_examine, compute_score, reward_fn_key, **reward_kwargs)
        if compute_score is None or is_default_scorer(compute_score):
            self.compute_score = _per_sample(compute_score or default_compute_score)

    def score_samples(self, samples: list[RewardSample]) -> list:
        results = self.compute_score(
            data_sources=[s.data_source for s in samples], solution_strs=[s.response_str for s in samples],
            ground_truths=[s.ground_truth for s in samples], extra_infos=[s.extra_info for s in samples],
            **self.reward_kwargs,
        )
        results = list(results)
        if len(results) != len(samples):
            raise ValueError(f"batch reward manager: compute_score returned {len(results)} results for "
                             f"{len(samples)} samples; it must return one score per sample")
        return results
