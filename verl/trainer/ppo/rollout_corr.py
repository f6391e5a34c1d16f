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

The actor's older ``tis_imp_ratio_cap`` computes the same token-level weights inside the update
(:func:`truncated_is_weights`, shared).

Rejection sampling (``rollout_rs*``), the token veto, batch-normalized weights and the pure policy-gradient loss
(``use_policy_gradient``) are accepted only at their defaults (``verl.trainer.config_schema`` says so).
"""

from __future__ import annotations

import torch

from verl.trainer.ppo.core_algos import agg_loss

__all__ = ["IS_LEVELS", "compute_rollout_is_weights", "on_policy_metrics", "truncated_is_weights",
           "rollout_probs_diff_metrics", "entropy_metric"]

IS_LEVELS = (None, "token", "sequence")
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


def compute_rollout_is_weights(old_log_probs: torch.Tensor, rollout_log_probs: torch.Tensor,
                               response_mask: torch.Tensor, level: str, threshold: float
                               ) -> tuple[torch.Tensor, dict[str, float]]:
    """:func:`truncated_is_weights` and their ``rollout_corr/*`` metrics over valid tokens."""
    weights, raw = truncated_is_weights(old_log_probs, rollout_log_probs, response_mask, level, threshold)
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
