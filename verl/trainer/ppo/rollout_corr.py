"""Rollout correction: the rollout engine's token probabilities vs the trainer's (``algorithm.rollout_correction``).

The rollout engine (vLLM, SGLang, HF generate in another precision) samples from ``pi_rollout``, which is close
to but not exactly the trainer's ``pi_old``. verl's keys, two of which are implemented here:

``bypass_mode: true``
    The rollout's log-probs *are* ``old_log_probs``: the trainer's separate log-prob pass is skipped, and the
    PPO ratio is ``pi_theta / pi_rollout``. On-policy GRPO (one mini-batch, one epoch) then costs one forward
    less per step. The sync metric ``training/rollout_probs_diff_*`` and ``actor/entropy`` still appear: the
    actor reports the log-probs/entropies of its first forward, taken before any optimizer step
    (:func:`on_policy_metrics`).

``rollout_is: token | sequence`` (decoupled mode, ``bypass_mode: false``)
    Importance weights ``pi_old / pi_rollout`` multiply the policy-gradient loss, truncated from above at
    ``rollout_is_threshold`` (truncated IS). ``token``: one weight per token, ``exp(old - rollout)``;
    ``sequence``: ``exp(sum_t (old - rollout))`` over the response, the same weight on every token.
    Log-ratios are clamped to [-20, 20] before ``exp`` so that no weight overflows; padding gets weight 0.

``rollout_is_batch_normalize: true``
    The truncated weights divided by their mean (over valid tokens for ``token``, over responses for
    ``sequence``), so that they average 1 and scale the loss only relative to each other.

``loss_type: reinforce`` (bypass mode)
    The policy loss becomes ``-w * A * log pi_theta`` per token (:func:`reinforce_is_loss`), with
    ``w = min(pi_theta / pi_rollout, rollout_is_threshold)`` at the ``rollout_is`` level, computed inside the update
    and detached (``w = 1`` when ``rollout_is`` is null: plain REINFORCE on the rollout's samples). Its gradient is
    the importance-weighted policy gradient without PPO's clipping. ``loss_type: ppo_clip`` (the default) keeps the
    actor's PPO loss, whose ratio is then ``pi_theta / pi_rollout``.

The actor's older ``tis_imp_ratio_cap`` computes the same token-level weights inside the update
(:func:`truncated_is_weights`, shared).

Rejection sampling (``rollout_rs*``), the token veto and the older ``use_policy_gradient`` switch are accepted
only at their defaults (``verl.trainer.config_schema`` says so).
"""

from __future__ import annotations

import torch

from verl.trainer.ppo.core_algos import agg_loss

__all__ = ["IS_LEVELS", "BYPASS_LOSS_TYPES", "compute_rollout_is_weights", "on_policy_metrics",
           "truncated_is_weights", "batch_normalize_is_weights", "reinforce_is_loss", "rollout_probs_diff_metrics",
           "entropy_metric"]

IS_LEVELS = (None, "token", "sequence")
BYPASS_LOSS_TYPES = ("ppo_clip", "reinforce")
_LOG_RATIO_BOUND = 20.0


def truncated_is_weights(old_log_probs: torch.Tensor, rollout_log_probs: torch.Tensor,
                         response_mask: torch.Tensor, level: str, threshold: float
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(weights, raw)``: ``min(pi_old / pi_rollout, threshold)`` at ``level`` (token | sequence), (B, R), zero
    on padding, in the dtype of ``old_log_probs``; ``raw`` the untruncated float64 ratios (bounded to e^+-20)."""
    if level not in ("token", "sequence"):
        raise ValueError(f"rollout_is level must be 'token' or 'sequence', got {level!r}")
    if not threshold > 0:
        raise ValueError(f"rollout_is_threshold must be > 0, got {threshold!r}")
    mask = response_mask.to(torch.float64)
    log_ratio = (old_log_probs.double() - rollout_log_probs.double()) * mask
    if level == "sequence":
        log_ratio = log_ratio.sum(dim=-1, keepdim=True).expand_as(mask)
    raw = torch.exp(log_ratio.clamp(-_LOG_RATIO_BOUND, _LOG_RATIO_BOUND))
    return (raw.clamp(max=threshold) * mask).to(old_log_probs.dtype), raw


def batch_normalize_is_weights(weights: torch.Tensor, response_mask: torch.Tensor, level: str) -> torch.Tensor:
    """``weights`` divided by their mean over valid tokens (``token``) or over responses with a valid token
    (``sequence``: each response's weight counted once); unchanged when nothing is valid or the mean is 0."""
    valid = response_mask.bool()
    if level == "sequence":
        rows = valid.any(dim=-1)
        if not rows.any():
            return weights
        first = valid.float().argmax(dim=-1)  # any valid position holds the response's weight
        mean = weights.double().gather(-1, first[:, None]).squeeze(-1)[rows].mean()
    else:
        if not valid.any():
            return weights
        mean = weights.double()[valid].mean()
    if mean <= 0:
        return weights
    return (weights.double() / mean).to(weights.dtype) * response_mask.to(weights.dtype)


def compute_rollout_is_weights(old_log_probs: torch.Tensor, rollout_log_probs: torch.Tensor,
                               response_mask: torch.Tensor, level: str, threshold: float,
                               batch_normalize: bool = False) -> tuple[torch.Tensor, dict[str, float]]:
    """:func:`truncated_is_weights` (divided by their mean with ``batch_normalize``) and their
    ``rollout_corr/*`` metrics over valid tokens (of the raw ratios)."""
    weights, raw = truncated_is_weights(old_log_probs, rollout_log_probs, response_mask, level, threshold)
    if batch_normalize:
        weights = batch_normalize_is_weights(weights, response_mask, level)
    valid = response_mask.bool()
    metrics = {}
    if valid.any():
        metrics = {
            "rollout_corr/rollout_is_mean": raw[valid].mean().item(),
            "rollout_corr/rollout_is_max": raw[valid].max().item(),
            "rollout_corr/rollout_is_min": raw[valid].min().item(),
            "rollout_corr/rollout_is_truncated_frac": (raw[valid] > threshold).double().mean().item(),
        }
    return weights, metrics


def reinforce_is_loss(log_prob: torch.Tensor, rollout_log_prob: torch.Tensor, advantages: torch.Tensor,
                      response_mask: torch.Tensor, loss_agg_mode: str, level: str | None, threshold: float,
                      batch_normalize: bool = False, metrics: dict | None = None
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Bypass mode's ``loss_type: reinforce``: ``agg(-w * A * log_prob)`` with ``w`` the truncated (and optionally
    batch-normalized) ``pi_theta / pi_rollout`` at ``level``, detached; ``w = 1`` for ``level=None``.

    Returns ``(pg_loss, truncated_frac, ppo_kl, 0)`` in the order of the policy-loss functions: the share of valid
    tokens whose raw ratio exceeds the threshold stands where PPO reports its clip fraction, ``ppo_kl`` is the
    mean of ``log pi_rollout - log pi_theta`` over valid tokens. ``metrics``, when given, receives
    ``rollout_corr/rollout_is_mean``: the mean untruncated ratio over valid tokens (with a level)."""
    mask = response_mask.to(log_prob.dtype)
    valid = response_mask.bool()
    truncated = torch.zeros((), dtype=log_prob.dtype, device=log_prob.device)
    if level is None:
        weights = mask
    else:
        weights, raw = truncated_is_weights(log_prob.detach(), rollout_log_prob, response_mask, level, threshold)
        if batch_normalize:
            weights = batch_normalize_is_weights(weights, response_mask, level)
        if valid.any():
            truncated = (raw[valid] > threshold).to(log_prob.dtype).mean()
            if metrics is not None:
                metrics["rollout_corr/rollout_is_mean"] = raw[valid].mean()
    pg_losses = -advantages * weights.detach() * log_prob
    pg_loss = agg_loss(loss_mat=pg_losses, loss_mask=response_mask, loss_agg_mode=loss_agg_mode)
    n = mask.sum().clamp(min=1)
    ppo_kl = ((rollout_log_prob - log_prob.detach()) * mask).sum() / n
    return pg_loss, truncated, ppo_kl, torch.zeros_like(truncated)


def rollout_probs_diff_metrics(rollout_log_probs: torch.Tensor, old_log_probs: torch.Tensor,
                               response_mask: torch.Tensor) -> dict[str, float]:
    """How far the rollout engine's token probabilities are from the trainer's (hybrid-engine sync check).

    |exp(rollout_log_prob) - exp(old_log_prob)| over valid response tokens: max, mean, std.
    """
    mask = response_mask.bool()
    if mask.sum() == 0:
        return {}
    diff = (rollout_log_probs.float().exp() - old_log_probs.float().exp()).abs()[mask]
    return {
        "training/rollout_probs_diff_max": diff.max().item(),
        "training/rollout_probs_diff_mean": diff.mean().item(),
        "training/rollout_probs_diff_std": diff.std().item() if diff.numel() > 1 else 0.0,
    }


def entropy_metric(entropys: torch.Tensor, response_mask: torch.Tensor, loss_agg_mode: str) -> float:
    return agg_loss(loss_mat=entropys, loss_mask=response_mask, loss_agg_mode=loss_agg_mode).detach().item()


def on_policy_metrics(on_policy: dict, rollout_log_probs: torch.Tensor | None, response_mask: torch.Tensor,
                      loss_agg_mode: str) -> dict[str, float]:
    """Bypass mode: ``actor/entropy`` and ``training/rollout_probs_diff_*`` from the actor's first-forward
    log-probs (``on_policy_log_probs``/``on_policy_entropys``, rows flagged by ``on_policy_rows``)."""
    rows = on_policy["on_policy_rows"].bool()
    if not rows.any():
        return {}
    mask = response_mask[rows]
    metrics = {"actor/entropy": entropy_metric(on_policy["on_policy_entropys"][rows], mask, loss_agg_mode),
               "training/rollout_probs_diff_rows": float(rows.sum().item())}
    if rollout_log_probs is not None:
        metrics.update(rollout_probs_diff_metrics(rollout_log_probs[rows], on_policy["on_policy_log_probs"][rows],
                                                  mask))
    return metrics
