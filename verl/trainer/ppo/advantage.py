"""Advantage estimators and their registry (re-exported by ``verl.trainer.ppo.core_algos``).

Shapes: ``token_level_rewards``, ``values``, ``response_mask``: (B, L); ``index``: B group ids (the prompt
``uid``; responses to the same prompt share one). Outcome estimators score a response by the sum of its
token rewards and broadcast one advantage over its valid tokens. Every estimator returns
``(advantages, returns)`` of shape (B, L), zero where ``response_mask`` is 0.

Add an estimator with ``@register_adv_est("name")``; ``compute_advantage`` passes it ``token_level_rewards``,
``response_mask``, ``config`` (the ``algorithm`` config) and, when present, ``index``, ``reward_baselines``,
``values``, ``gamma``, ``lam`` and ``norm_adv_by_std_in_grpo`` (only the ones its signature names, or all
of them if it takes ``**kwargs``).
"""

from __future__ import annotations

from enum import Enum
from typing import Callable, NamedTuple, Optional

import numpy as np
import torch

from verl.utils import torch_functional as verl_F
from verl.utils.groupwise import as_torch_index, group_mean_std

__all__ = [
    "AdvantageEstimator",
    "ADV_ESTIMATOR_REGISTRY",
    "register_adv_est",
    "get_adv_estimator_fn",
    "compute_gae_advantage_return",
    "compute_grpo_outcome_advantage",
    "compute_grpo_vectorized_outcome_advantage",
    "compute_rloo_vectorized_outcome_advantage",
    "compute_grpo_passk_outcome_advantage",
    "compute_rloo_outcome_advantage",
    "compute_opo_outcome_advantage",
    "compute_reinforce_plus_plus_outcome_advantage",
    "compute_reinforce_plus_plus_baseline_outcome_advantage",
    "compute_remax_outcome_advantage",
    "compute_gpg_outcome_advantage",
]


class AdvantageEstimator(str, Enum):
    """Names accepted by ``algorithm.adv_estimator``."""

    GAE = "gae"
    GRPO = "grpo"
    REINFORCE_PLUS_PLUS = "reinforce_plus_plus"
    REINFORCE_PLUS_PLUS_BASELINE = "reinforce_plus_plus_baseline"
    REMAX = "remax"
    RLOO = "rloo"
    OPO = "opo"
    GRPO_PASSK = "grpo_passk"
    GPG = "gpg"
    RLOO_VECTORIZED = "rloo_vectorized"
    GRPO_VECTORIZED = "grpo_vectorized"

    def __str__(self) -> str:
        return self.value


ADV_ESTIMATOR_REGISTRY: dict[str, Callable] = {}


def register_adv_est(name_or_enum):
    """Decorator: register an advantage estimator under a name (str or ``AdvantageEstimator``)."""
    name = name_or_enum.value if isinstance(name_or_enum, Enum) else str(name_or_enum)

    def decorator(fn):
        if name in ADV_ESTIMATOR_REGISTRY and ADV_ESTIMATOR_REGISTRY[name] is not fn:
            raise ValueError(f"advantage estimator {name!r} is already registered ({ADV_ESTIMATOR_REGISTRY[name]})")
        ADV_ESTIMATOR_REGISTRY[name] = fn
        return fn

    return decorator


def get_adv_estimator_fn(name_or_enum) -> Callable:
    """The estimator registered under ``name_or_enum``; unknown names list the registered ones."""
    name = name_or_enum.value if isinstance(name_or_enum, Enum) else str(name_or_enum)
    if name not in ADV_ESTIMATOR_REGISTRY:
        raise ValueError(
            f"unknown advantage estimator {name!r} (algorithm.adv_estimator); registered: "
            f"{sorted(ADV_ESTIMATOR_REGISTRY)}. Add one with @register_adv_est('{name}')."
        )
    return ADV_ESTIMATOR_REGISTRY[name]


# --------------------------------------------------------------------------------------------------------------
# group helpers
# --------------------------------------------------------------------------------------------------------------
def _group_ids(index, device) -> tuple[torch.Tensor, int]:
    """Map arbitrary hashable group labels to 0..G-1 (first-appearance order)."""
    if isinstance(index, torch.Tensor):
        index = index.tolist()
    mapping: dict = {}
    ids = [mapping.setdefault(u.item() if isinstance(u, np.generic) else u, len(mapping)) for u in index]
    return torch.tensor(ids, dtype=torch.long, device=device), len(mapping)


def _group_sum(values: torch.Tensor, gid: torch.Tensor, num_groups: int) -> torch.Tensor:
    """(G,) sums of ``values`` over the samples of each group."""
    return torch.zeros(num_groups, dtype=values.dtype, device=values.device).index_add_(0, gid, values)


class _GroupStats(NamedTuple):
    """Per-sample statistics of the sample's group (each field has shape (B,), aligned with the batch)."""

    size: torch.Tensor  # number of responses in the group (float, scores' dtype)
    mean: torch.Tensor  # group mean of the scores; 0 for a singleton group
    std: torch.Tensor  # group unbiased std of the scores; 1 for a singleton group
    gid: torch.Tensor  # group id 0..G-1 (first-appearance order of ``index``)


def _group_stats(scores: torch.Tensor, index) -> _GroupStats:
    """Group size, mean and unbiased std of ``scores`` for every sample; singleton groups get mean 0, std 1."""
    gid, num_groups = _group_ids(index, scores.device)
    count = torch.bincount(gid, minlength=num_groups).to(scores.dtype)
    mean = _group_sum(scores, gid, num_groups) / count
    sq_dev = (scores - mean[gid]) ** 2
    var = _group_sum(sq_dev, gid, num_groups) / (count - 1).clamp(min=1)
    single = count == 1
    mean = torch.where(single, torch.zeros_like(mean), mean)
    std = torch.where(single, torch.ones_like(var), var.sqrt())
    return _GroupStats(size=count[gid], mean=mean[gid], std=std[gid], gid=gid)


def _broadcast(per_seq: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    return per_seq.unsqueeze(-1) * response_mask


# --------------------------------------------------------------------------------------------------------------
# estimators
# --------------------------------------------------------------------------------------------------------------
@register_adv_est(AdvantageEstimator.GAE)
def compute_gae_advantage_return(
    token_level_rewards: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    gamma,
    lam,
    **kwargs,
):
    """Generalised Advantage Estimation (Schulman et al. 2016, "High-Dimensional Continuous Control Using GAE").

    delta_t = r_t + gamma * V_{t+1} - V_t;  A_t = delta_t + gamma * lam * A_{t+1};  returns R_t = A_t + V_t.
    "t+1" is the next *valid* token: masked positions (padding, or tool/observation tokens inside a
    multi-turn response) are skipped, and after the last valid token V = 0 and A = 0. Advantages are then
    whitened over the valid tokens (PPO practice); returns are not.
    """
    with torch.no_grad():
        mask = response_mask.to(values.dtype)
        next_value = torch.zeros_like(values[:, 0])
        next_adv = torch.zeros_like(values[:, 0])
        advantages = torch.zeros_like(values)
        for t in reversed(range(values.shape[-1])):
            delta = token_level_rewards[:, t] + gamma * next_value - values[:, t]
            adv_t = delta + gamma * lam * next_adv
            m = mask[:, t]
            next_value = m * values[:, t] + (1 - m) * next_value
            next_adv = m * adv_t + (1 - m) * next_adv
            advantages[:, t] = next_adv
        returns = (advantages + values) * mask
        advantages = verl_F.masked_whiten(advantages, mask) * mask
    return advantages, returns


@register_adv_est(AdvantageEstimator.GRPO)
def compute_grpo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
    config=None,
    **kwargs,
):
    """GRPO group-relative advantage (Shao et al. 2024, DeepSeekMath).

    A_i = (s_i - mean_group(s)) / (std_group(s) + epsilon) with the unbiased std over the responses that
    share ``index[i]``. ``norm_adv_by_std_in_grpo=False`` gives Dr.GRPO (Liu et al. 2025, "Understanding
    R1-Zero-Like Training"): A_i = s_i - mean_group(s). A group of one response has mean 0 and std 1.
    """
    with torch.no_grad():
        scores = token_level_rewards.sum(dim=-1)
        group = _group_stats(scores, index)
        adv = scores - group.mean
        if norm_adv_by_std_in_grpo:
            adv = adv / (group.std + epsilon)
        adv = _broadcast(adv, response_mask)
    return adv, adv


@register_adv_est(AdvantageEstimator.GRPO_VECTORIZED)
def compute_grpo_vectorized_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
    config=None,
    **kwargs,
):
    """GRPO / Dr.GRPO advantage (same definition as ``grpo``) computed with scatter-adds over group ids
    (:func:`verl.utils.groupwise.group_mean_std`): A_i = (s_i - mean_g) / (std_g + epsilon), or s_i - mean_g.

    As in verl, the group variance is floored at ``epsilon`` before the square root; this only matters for a
    group whose scores are (nearly) all equal, where the numerator is (nearly) zero anyway.
    """
    with torch.no_grad():
        scores = token_level_rewards.sum(dim=-1)
        gid = as_torch_index(index, device=scores.device)
        mean_g, std_g, _ = group_mean_std(scores, gid, eps=epsilon)
        adv = scores - mean_g[gid].to(scores.dtype)
        if norm_adv_by_std_in_grpo:
            adv = adv / (std_g[gid].to(scores.dtype) + epsilon)
        adv = _broadcast(adv, response_mask)
    return adv, adv


@register_adv_est(AdvantageEstimator.GRPO_PASSK)
def compute_grpo_passk_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
    config=None,
    **kwargs,
):
    """Pass@k GRPO (Thrampoulidis et al. 2025, "Reinforcement Learning for Pass@k"; verl's ``grpo_passk``).

    Only the best response of each group gets a non-zero advantage, r_max - r_second_max (divided by
    std_group + epsilon if ``norm_adv_by_std_in_grpo``, read from ``config`` when given). Ties go to the
    first best response in batch order. Every group needs at least 2 responses.
    """
    if config is not None:
        norm_adv_by_std_in_grpo = config.norm_adv_by_std_in_grpo
    with torch.no_grad():
        scores = token_level_rewards.sum(dim=-1)
        group = _group_stats(scores, index)
        gid = group.gid
        advantages = torch.zeros_like(scores)
        for g in range(int(gid.max().item()) + 1 if len(gid) else 0):
            members = torch.nonzero(gid == g).flatten()
            if len(members) < 2:
                raise ValueError(
                    f"grpo_passk needs at least 2 responses per prompt, got {len(members)} for uid "
                    f"{list(index)[members[0].item()]!r}; set actor_rollout_ref.rollout.n >= 2"
                )
            group_scores = scores[members]
            order = torch.argsort(-group_scores, stable=True)
            best, second = order[0], order[1]
            gap = group_scores[best] - group_scores[second]
            if norm_adv_by_std_in_grpo:
                gap = gap / (group.std[members[0]] + epsilon)
            advantages[members[best]] = gap
        advantages = _broadcast(advantages, response_mask)
    return advantages, advantages


@register_adv_est(AdvantageEstimator.RLOO)
def compute_rloo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index,
    epsilon: float = 1e-6,
    config=None,
    **kwargs,
):
    """REINFORCE Leave-One-Out (Kool et al. 2019; Ahmadian et al. 2024, "Back to Basics").

    A_i = s_i - mean_{j != i in group}(s_j) = n/(n-1) * (s_i - mean_group(s)). A singleton keeps A_i = s_i.
    """
    with torch.no_grad():
        scores = token_level_rewards.sum(dim=-1)
        group = _group_stats(scores, index)
        n, mean = group.size, group.mean
        leave_one_out = torch.where(n > 1, (scores - mean) * n / (n - 1).clamp(min=1), scores)
        adv = _broadcast(leave_one_out, response_mask)
    return adv, adv


@register_adv_est(AdvantageEstimator.RLOO_VECTORIZED)
def compute_rloo_vectorized_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index,
    epsilon: float = 1e-6,
    config=None,
    **kwargs,
):
    """RLOO with group sums from ``bincount``: A_i = (n s_i - sum_group(s)) / (n - 1); 0 for a group of one
    (verl's ``rloo_vectorized``; the loop ``rloo`` keeps a singleton's own score instead)."""
    with torch.no_grad():
        scores = token_level_rewards.sum(dim=-1)
        gid = as_torch_index(index, device=scores.device)
        count = torch.bincount(gid)[gid].to(scores.dtype)
        group_sum = torch.bincount(gid, weights=scores)[gid].to(scores.dtype)
        adv = (count * scores - group_sum) / (count - 1).clamp_min(1) * (count > 1)
        adv = _broadcast(adv, response_mask)
    return adv, adv


@register_adv_est(AdvantageEstimator.OPO)
def compute_opo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index,
    epsilon: float = 1e-6,
    config=None,
    **kwargs,
):
    """On-Policy RL with Optimal reward baseline (Hao et al. 2025, "OPO").

    A_i = s_i - b with the length-weighted group baseline b = sum_j |o_j| s_j / sum_j |o_j| (|o_j| = number
    of valid response tokens). A singleton group has b = 0.
    """
    with torch.no_grad():
        scores = token_level_rewards.sum(dim=-1)
        lengths = response_mask.sum(dim=-1).to(scores.dtype)
        gid, num_groups = _group_ids(index, scores.device)
        weighted = _group_sum(lengths * scores, gid, num_groups)
        total_len = _group_sum(lengths, gid, num_groups)
        count = torch.bincount(gid, minlength=num_groups)
        baseline = torch.where(count > 1, weighted / total_len.clamp(min=1e-8), torch.zeros_like(weighted))
        adv = _broadcast(scores - baseline[gid], response_mask)
    return adv, adv


@register_adv_est(AdvantageEstimator.REINFORCE_PLUS_PLUS)
def compute_reinforce_plus_plus_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    config=None,
    gamma: Optional[float] = None,
    **kwargs,
):
    """REINFORCE++ (Hu 2025, "REINFORCE++: A Simple and Efficient Approach for Aligning LLMs").

    Discounted return-to-go G_t = r_t + gamma * G_{t+1} inside each response (reset at masked tokens),
    then whitened over all valid tokens of the batch. ``gamma`` defaults to ``config.gamma`` (the algorithm
    section); one of them is needed. Returns ``(advantages, returns)``.
    """
    if gamma is None:
        if config is None:
            raise ValueError("reinforce_plus_plus needs gamma, or config (the algorithm section, for algorithm.gamma)")
        gamma = config.gamma
    with torch.no_grad():
        mask = response_mask.to(token_level_rewards.dtype)
        returns = torch.zeros_like(token_level_rewards)
        running = torch.zeros_like(token_level_rewards[:, 0])
        for t in reversed(range(token_level_rewards.shape[-1])):
            running = (token_level_rewards[:, t] + gamma * running) * mask[:, t]
            returns[:, t] = running
        advantages = verl_F.masked_whiten(returns, mask) * mask
    return advantages, returns


@register_adv_est(AdvantageEstimator.REINFORCE_PLUS_PLUS_BASELINE)
def compute_reinforce_plus_plus_baseline_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index,
    epsilon: float = 1e-6,
    config=None,
    **kwargs,
):
    """REINFORCE++ with a group baseline (Hu 2025, REINFORCE++ paper, "REINFORCE++-baseline").

    A_i = s_i - mean_group(s) (singleton: mean 0), broadcast over the response and whitened over all valid
    tokens of the batch.
    """
    with torch.no_grad():
        scores = token_level_rewards.sum(dim=-1)
        group = _group_stats(scores, index)
        mask = response_mask.to(scores.dtype)
        adv = _broadcast(scores - group.mean, mask)
        adv = verl_F.masked_whiten(adv, mask) * mask
    return adv, adv


@register_adv_est(AdvantageEstimator.REMAX)
def compute_remax_outcome_advantage(
    token_level_rewards: torch.Tensor,
    reward_baselines: torch.Tensor,
    response_mask: torch.Tensor,
    config=None,
    **kwargs,
):
    """ReMax (Li et al. 2023, "ReMax: A Simple, Effective, and Efficient RL Method for Aligning LLMs").

    Returns are the undiscounted reward-to-go G_t = sum_{t' >= t} r_t'; the baseline is the reward of the
    greedy response (``reward_baselines``, shape (B,)): A_t = G_t - b.
    """
    with torch.no_grad():
        mask = response_mask.to(token_level_rewards.dtype)
        returns = (token_level_rewards * mask).flip(dims=[-1]).cumsum(dim=-1).flip(dims=[-1]) * mask
        advantages = returns - reward_baselines.reshape(-1, 1).to(returns.dtype) * mask
    return advantages, returns


@register_adv_est(AdvantageEstimator.GPG)
def compute_gpg_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index,
    epsilon: float = 1e-6,
    f_norm: float = 1.0,
    alpha: float = 1.0,
    config=None,
    **kwargs,
):
    """Group Policy Gradient (Chu et al. 2025, "GPG: A Simple and Strong RL Baseline for Model Reasoning").

    A_i = alpha * (s_i - mean_group(s)) / f_norm with the batch correction alpha = B / M, M the number of
    responses with a non-zero score (at least 1). Singleton groups have mean 0. ``alpha`` is recomputed
    from the batch as the paper prescribes; ``f_norm`` is kept from the argument.
    """
    with torch.no_grad():
        scores = token_level_rewards.sum(dim=-1)
        group = _group_stats(scores, index)
        num_nonzero = torch.count_nonzero(scores).clamp(min=1)
        alpha = scores.shape[0] / num_nonzero.to(scores.dtype)
        adv = _broadcast(alpha * (scores - group.mean) / f_norm, response_mask)
    return adv, adv
