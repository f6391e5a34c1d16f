"""PF-PPO: Policy Filtration for PPO (Zhang et al. 2024, "Policy Filtration in RLHF to Fine-Tune LLM for Code
Generation", arXiv:2409.06957).

The reward model is least reliable on middling responses, so PF-PPO trains on the ones whose score it trusts:
after the advantages are computed, the batch is resampled with replacement (same size) with a weight per
sequence derived from its total score ``s = sum_t token_level_scores_t``:

- ``pow``:        w = |s| ** weight_pow            (weight_pow=0: uniform, i.e. plain bootstrap resampling)
- ``max_min``:    w = 1 if s is the batch max or min, else 0   (keep only the best and the worst)
- ``max_random``: w = 0.4 if s is the batch max, else 0.1      (favour the best, keep a random share of the rest)

As in verl, every weight gets +1e-8 before sampling, so a batch whose weights are all zero is resampled
uniformly. Turned on by ``algorithm.use_pf_ppo=True`` with ``algorithm.pf_ppo.{reweight_method, weight_pow}``;
like verl, the trainer applies it only with ``algorithm.adv_estimator=gae`` (inside ``compute_advantage``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import torch

if TYPE_CHECKING:
    from verl.protocol import DataProto

__all__ = ["REWEIGHT_METHODS", "pf_ppo_weights", "pf_ppo_sample_indices", "compute_pf_ppo_reweight_data"]

REWEIGHT_METHODS = ("pow", "max_min", "max_random")
_EPS = 1e-8


def _check_method(reweight_method: str) -> None:
    if reweight_method not in REWEIGHT_METHODS:
        raise ValueError(f"algorithm.pf_ppo.reweight_method={reweight_method!r} is not one of: "
                         + ", ".join(REWEIGHT_METHODS))


@torch.no_grad()
def pf_ppo_weights(scores: torch.Tensor, reweight_method: str = "pow", weight_pow: float = 2.0) -> torch.Tensor:
    """Unnormalised sampling weights (before the +1e-8) for sequence scores ``scores`` of shape (batch,)."""
    _check_method(reweight_method)
    scores = scores.double()
    if reweight_method == "pow":
        return scores.abs().pow(float(weight_pow))
    best = scores == scores.max()
    if reweight_method == "max_min":
        return (best | (scores == scores.min())).double()
    return torch.full_like(scores, 0.1).masked_fill(best, 0.4)  # max_random


@torch.no_grad()
def pf_ppo_sample_indices(scores: torch.Tensor, reweight_method: str = "pow", weight_pow: float = 2.0,
                          generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """``len(scores)`` row indices drawn with replacement with probability proportional to the weights."""
    weights = pf_ppo_weights(scores, reweight_method, weight_pow) + _EPS
    if not torch.isfinite(weights).all():
        raise ValueError(f"PF-PPO weights are not finite (algorithm.pf_ppo.weight_pow={weight_pow} with a zero or "
                         "huge score?); use a weight_pow >= 0")
    return torch.multinomial(weights, num_samples=len(scores), replacement=True, generator=generator)


def compute_pf_ppo_reweight_data(data: "DataProto", reweight_method: str = "pow", weight_pow: float = 2.0,
                                 generator: Optional[torch.Generator] = None) -> "DataProto":
    """``data`` resampled by PF-PPO weights of ``data.batch["token_level_scores"].sum(-1)``.

    Every tensor and non-tensor field is reordered by the same indices, and so is every ``meta_info`` list
    with one entry per row (e.g. ``global_token_num``); other ``meta_info`` values are kept. ``generator``
    defaults to torch's global RNG (verl's behaviour).
    """
    scores = data.batch["token_level_scores"].sum(dim=-1)
    idx = pf_ppo_sample_indices(scores, reweight_method, weight_pow, generator=generator)
    out = data.select_idxs(idx)
    n, idx_list = len(data), idx.tolist()
    out.meta_info = {k: ([v[i] for i in idx_list] if isinstance(v, list) and len(v) == n else v)
                     for k, v in data.meta_info.items()}
    return out
