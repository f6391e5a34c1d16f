"""Loss aggregation, policy-gradient losses (with registry), entropy and value losses.

Re-exported by ``verl.trainer.ppo.core_algos``. Shapes: per-token tensors are (B, L); ``response_mask`` is
1 on the tokens that count. A registered policy loss has the signature

    fn(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None,
       rollout_is_weights=None) -> (pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower)

where ``config`` is the typed actor config (``verl.workers.config.FSDPActorConfig`` / ``McoreActorConfig``: its
``clip_ratio``, ``clip_ratio_low``, ``clip_ratio_high``, ``clip_ratio_c``, ``tau_pos``, ``tau_neg`` and
``policy_loss.*`` attributes are read, as in verl; losses that read none accept None), and ``rollout_is_weights``
(optional, (B, L)) are truncated importance weights multiplied into the per-token loss.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

from verl.utils import torch_functional as verl_F

__all__ = [
    "LOSS_AGG_MODES",
    "agg_loss",
    "POLICY_LOSS_REGISTRY",
    "register_policy_loss",
    "get_policy_loss_fn",
    "compute_policy_loss",
    "compute_policy_loss_vanilla",
    "compute_policy_loss_gspo",
    "compute_policy_loss_gpg",
    "compute_policy_loss_clip_cov",
    "compute_policy_loss_kl_cov",
    "compute_policy_loss_geo_mean",
    "compute_policy_loss_cispo",
    "compute_policy_loss_sapo",
    "compute_entropy_loss",
    "compute_value_loss",
]

LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def agg_loss(loss_mat: torch.Tensor, loss_mask: torch.Tensor, loss_agg_mode: str, loss_scale_factor=None) -> torch.Tensor:
    """Reduce a (B, L) per-token loss to a scalar.

    - ``token-mean``: sum of masked token losses / number of valid tokens (DAPO's token-level loss).
    - ``seq-mean-token-sum``: mean over sequences of each sequence's token sum.
    - ``seq-mean-token-mean``: mean over sequences of each sequence's token mean (original GRPO).
    - ``seq-mean-token-sum-norm``: mean over sequences of token sums divided by a constant, the response
      horizon ``L = loss_mask.shape[-1]`` (or ``loss_scale_factor``), so no length bias (Dr.GRPO, Liu et al.
      2025). Note: equals sum / (B' * L); some verl versions use sum / L.

    The ``seq-mean-*`` modes average over the B' sequences with at least one valid token, as verl does:
    fully masked rows (e.g. padding added to balance data-parallel ranks) do not dilute the loss. With no
    valid sequence at all the loss is 0.
    """
    mask = loss_mask.to(loss_mat.dtype)
    if loss_agg_mode == "token-mean":
        return verl_F.masked_mean(loss_mat, mask)
    seq_sums = verl_F.masked_sum(loss_mat, mask, axis=-1)
    seq_lens = mask.sum(dim=-1)
    num_seqs = (seq_lens > 0).sum().clamp(min=1)  # empty rows have seq_sums == 0, so summing them is harmless
    if loss_agg_mode == "seq-mean-token-sum":
        return seq_sums.sum() / num_seqs
    if loss_agg_mode == "seq-mean-token-mean":
        return (seq_sums / seq_lens.clamp(min=1)).sum() / num_seqs
    if loss_agg_mode == "seq-mean-token-sum-norm":
        horizon = loss_mask.shape[-1] if loss_scale_factor is None else loss_scale_factor
        return seq_sums.sum() / num_seqs / horizon
    raise ValueError(f"unknown loss_agg_mode {loss_agg_mode!r} (actor.loss_agg_mode); choose one of {list(LOSS_AGG_MODES)}")


POLICY_LOSS_REGISTRY: dict[str, Callable] = {}


def register_policy_loss(name: str):
    """Decorator: register a policy loss under ``actor.policy_loss.loss_mode=<name>``."""

    def decorator(fn):
        if name in POLICY_LOSS_REGISTRY and POLICY_LOSS_REGISTRY[name] is not fn:
            raise ValueError(f"policy loss {name!r} is already registered ({POLICY_LOSS_REGISTRY[name]})")
        POLICY_LOSS_REGISTRY[name] = fn
        return fn

    return decorator


def get_policy_loss_fn(name: str) -> Callable:
    """The policy loss registered under ``name``; unknown names list the registered ones."""
    if name not in POLICY_LOSS_REGISTRY:
        raise ValueError(
            f"unknown policy loss {name!r} (actor_rollout_ref.actor.policy_loss.loss_mode); registered: "
            f"{sorted(POLICY_LOSS_REGISTRY)}. Add one with @register_policy_loss('{name}')."
        )
    return POLICY_LOSS_REGISTRY[name]


def _actor_config(config, loss: str):
    """``config``, or a ValueError saying that the loss reads its parameters from the actor config."""
    if config is None:
        raise ValueError(f"policy loss {loss!r} reads its parameters from the actor config: pass config=<the typed "
                         "actor config> (e.g. omega_conf_to_dataclass(actor_section, FSDPActorConfig))")
    return config


def _clip_ranges(config, loss: str) -> tuple[float, float]:
    """(eps_low, eps_high): the actor config's ``clip_ratio_low`` / ``clip_ratio_high``."""
    config = _actor_config(config, loss)
    return config.clip_ratio_low, config.clip_ratio_high


def _weighted(pg_losses: torch.Tensor, rollout_is_weights: Optional[torch.Tensor]) -> torch.Tensor:
    return pg_losses if rollout_is_weights is None else pg_losses * rollout_is_weights


def _zero(like: torch.Tensor) -> torch.Tensor:
    return torch.zeros((), dtype=like.dtype, device=like.device)


# --------------------------------------------------------------------------------------------------------------
# PPO clip (vanilla), asymmetric clip (DAPO), dual clip
# --------------------------------------------------------------------------------------------------------------
def compute_policy_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    cliprange: Optional[float] = None,
    cliprange_low: Optional[float] = None,
    cliprange_high: Optional[float] = None,
    clip_ratio_c: float = 3.0,
    loss_agg_mode: str = "token-mean",
    rollout_is_weights: Optional[torch.Tensor] = None,
):
    """Clipped surrogate objective (Schulman et al. 2017, PPO) with asymmetric clip (DAPO, Yu et al. 2025)
    and dual clip for negative advantages (Ye et al. 2020, "Mastering Complex Control in MOBA Games").

        r = exp(log_prob - old_log_prob)
        L = max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high))          (PPO)
        L = min(L, -A c)   where A < 0                                 (dual clip, c = clip_ratio_c > 1)

    Returns ``(pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower)``: the fraction of tokens where the clip is
    active, the masked mean of old - new log-prob, and the fraction where the dual clip is active.
    """
    if not clip_ratio_c > 1.0:
        raise ValueError(f"clip_ratio_c (dual-clip constant) must be > 1.0, got {clip_ratio_c}")
    eps_low = cliprange if cliprange_low is None else cliprange_low
    eps_high = cliprange if cliprange_high is None else cliprange_high
    if eps_low is None or eps_high is None:
        raise ValueError("compute_policy_loss needs cliprange, or both cliprange_low and cliprange_high")

    log_ratio = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    ratio = torch.exp(log_ratio)
    ppo_kl = verl_F.masked_mean(-log_ratio, response_mask)

    loss_unclipped = -advantages * ratio
    loss_clipped = -advantages * torch.clamp(ratio, 1 - eps_low, 1 + eps_high)
    ppo_loss = torch.maximum(loss_unclipped, loss_clipped)
    pg_clipfrac = verl_F.masked_mean((loss_clipped > loss_unclipped).float(), response_mask)

    dual_bound = -advantages * clip_ratio_c
    dual_loss = torch.minimum(ppo_loss, dual_bound)
    pg_clipfrac_lower = verl_F.masked_mean(((ppo_loss > dual_bound) & (advantages < 0)).float(), response_mask)

    pg_losses = torch.where(advantages < 0, dual_loss, ppo_loss)
    pg_loss = agg_loss(_weighted(pg_losses, rollout_is_weights), response_mask, loss_agg_mode)
    return pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower


@register_policy_loss("vanilla")
def compute_policy_loss_vanilla(
    old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None, rollout_is_weights=None
):
    """PPO clipped surrogate (Schulman et al. 2017) reading clip ranges from the actor config; see
    :func:`compute_policy_loss`."""
    config = _actor_config(config, "vanilla")
    return compute_policy_loss(
        old_log_prob,
        log_prob,
        advantages,
        response_mask,
        cliprange=config.clip_ratio,
        cliprange_low=config.clip_ratio_low,
        cliprange_high=config.clip_ratio_high,
        clip_ratio_c=config.clip_ratio_c,
        loss_agg_mode=loss_agg_mode,
        rollout_is_weights=rollout_is_weights,
    )


# --------------------------------------------------------------------------------------------------------------
# sequence-level and other objectives
# --------------------------------------------------------------------------------------------------------------
@register_policy_loss("gspo")
def compute_policy_loss_gspo(
    old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="seq-mean-token-mean", config=None,
    rollout_is_weights=None,
):
    """Group Sequence Policy Optimization (Zheng et al. 2025, "GSPO").

    Sequence ratio s_i = (pi(y_i)/pi_old(y_i))^(1/|y_i|) = exp(mean_t log r_{i,t}), used per token as
    s_{i,t} = sg[s_i] * pi(y_t) / sg[pi(y_t)] (same value, token-level gradient), clipped like PPO with
    ``clip_ratio_low/high``. Always aggregated as ``seq-mean-token-mean`` (the paper's objective), whatever
    ``loss_agg_mode`` says. ``pg_clipfrac_lower`` is 0.
    """
    eps_low, eps_high = _clip_ranges(config, "gspo")
    mask = response_mask.to(log_prob.dtype)
    log_ratio = log_prob - old_log_prob
    seq_log_ratio = verl_F.masked_sum(log_ratio, mask, axis=-1) / mask.sum(dim=-1).clamp(min=1)

    log_s = seq_log_ratio.detach().unsqueeze(-1) + log_prob - log_prob.detach()
    s = torch.exp(torch.clamp(log_s, max=10.0))

    loss_unclipped = -advantages * s
    loss_clipped = -advantages * torch.clamp(s, 1 - eps_low, 1 + eps_high)
    pg_losses = torch.maximum(loss_unclipped, loss_clipped)
    pg_loss = agg_loss(_weighted(pg_losses, rollout_is_weights), response_mask, "seq-mean-token-mean")

    pg_clipfrac = verl_F.masked_mean((loss_clipped > loss_unclipped).float(), response_mask)
    ppo_kl = verl_F.masked_mean(-log_ratio, response_mask)
    return pg_loss, pg_clipfrac, ppo_kl, _zero(pg_loss)


@register_policy_loss("gpg")
def compute_policy_loss_gpg(
    old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None, rollout_is_weights=None
):
    """Group Policy Gradient (Chu et al. 2025, "GPG"): plain policy gradient L = -A log pi, no ratio, no clip.
    ``pg_clipfrac``, ``ppo_kl`` and ``pg_clipfrac_lower`` are 0."""
    pg_losses = -advantages * log_prob
    pg_loss = agg_loss(_weighted(pg_losses, rollout_is_weights), response_mask, loss_agg_mode)
    zero = _zero(pg_loss)
    return pg_loss, zero, zero, zero


def _centered_cov(advantages: torch.Tensor, log_prob: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Per-token covariance term (A - mean A)(log pi - mean log pi), means over valid tokens of the batch."""
    adv = advantages.detach()
    logp = log_prob.detach()
    return (adv - verl_F.masked_mean(adv, response_mask)) * (logp - verl_F.masked_mean(logp, response_mask))


@register_policy_loss("clip_cov")
def compute_policy_loss_clip_cov(
    old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None, rollout_is_weights=None
):
    """Clip-Cov (Cui et al. 2025, "The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models").

    PPO-clip loss, except that among the tokens not already clipped and whose covariance
    Cov_t = (A_t - mean A)(log pi_t - mean log pi) lies in (``policy_loss.clip_cov_lb``, ``clip_cov_ub``),
    a random ``policy_loss.clip_cov_ratio`` fraction of all valid tokens (at least one) is excluded from the
    loss (its gradient, and value, set to 0). Selection uses torch's global RNG. ``pg_clipfrac`` reports the
    fraction of excluded tokens; ``pg_clipfrac_lower`` is 0.
    """
    eps_low, eps_high = _clip_ranges(config, "clip_cov")
    ratio_r = config.policy_loss.clip_cov_ratio
    cov_lb, cov_ub = config.policy_loss.clip_cov_lb, config.policy_loss.clip_cov_ub
    if not ratio_r > 0:
        raise ValueError(f"policy_loss.clip_cov_ratio must be > 0 for clip_cov, got {ratio_r}")

    log_ratio = log_prob - old_log_prob
    ratio = torch.exp(log_ratio)
    ppo_kl = verl_F.masked_mean(-log_ratio, response_mask)
    loss_unclipped = -advantages * ratio
    loss_clipped = -advantages * torch.clamp(ratio, 1 - eps_low, 1 + eps_high)

    with torch.no_grad():
        valid = response_mask > 0
        cov = _centered_cov(advantages, log_prob, response_mask)
        candidates = valid & ~(loss_clipped > loss_unclipped) & (cov > cov_lb) & (cov < cov_ub)
        cand_idx = torch.nonzero(candidates)
        num_clip = max(int(ratio_r * valid.sum().item()), 1)
        chosen = cand_idx[torch.randperm(len(cand_idx), device=cand_idx.device)[:num_clip]]
        keep = torch.ones_like(advantages)
        keep[chosen[:, 0], chosen[:, 1]] = 0

    pg_losses = torch.maximum(loss_unclipped, loss_clipped) * keep
    pg_loss = agg_loss(_weighted(pg_losses, rollout_is_weights), response_mask, loss_agg_mode)
    pg_clipfrac = verl_F.masked_mean((keep == 0).float(), response_mask)
    return pg_loss, pg_clipfrac, ppo_kl, _zero(pg_loss)


@register_policy_loss("kl_cov")
def compute_policy_loss_kl_cov(
    old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None, rollout_is_weights=None
):
    """KL-Cov (Cui et al. 2025, "The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models").

    Unclipped policy gradient L_t = -A_t r_t; on the top ``policy_loss.kl_cov_ratio`` fraction of valid
    tokens by covariance (A - mean A)(log pi - mean log pi) (at least one token) a KL penalty is added:
    L_t = -A_t r_t + ``policy_loss.ppo_kl_coef`` * |log r_t|. ``ppo_kl`` reports the masked mean of
    |log r|; clip fractions are 0.
    """
    policy_loss = _actor_config(config, "kl_cov").policy_loss
    ratio_k, kl_coef = policy_loss.kl_cov_ratio, policy_loss.ppo_kl_coef

    log_ratio = log_prob - old_log_prob
    ratio = torch.exp(log_ratio)
    abs_kl = log_ratio.abs()
    ppo_kl_abs = verl_F.masked_mean(abs_kl, response_mask)

    with torch.no_grad():
        valid = response_mask > 0
        cov = _centered_cov(advantages, log_prob, response_mask)
        penalise = torch.zeros_like(valid)
        num_valid = int(valid.sum().item())
        if ratio_k > 0 and num_valid > 0:
            k = max(1, int(num_valid * ratio_k))
            flat_valid = torch.nonzero(valid.reshape(-1)).flatten()
            top = torch.topk(cov.reshape(-1)[flat_valid], k, largest=True).indices
            penalise.view(-1)[flat_valid[top]] = True

    pg_losses = -advantages * ratio + torch.where(penalise, kl_coef * abs_kl, torch.zeros_like(abs_kl))
    pg_loss = agg_loss(_weighted(pg_losses, rollout_is_weights), response_mask, loss_agg_mode)
    zero = _zero(pg_loss)
    return pg_loss, zero, ppo_kl_abs, zero


@register_policy_loss("geo_mean")
def compute_policy_loss_geo_mean(
    old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None, rollout_is_weights=None
):
    """Geometric-Mean Policy Optimization (Zhao et al. 2025, "GMPO").

    Token log-ratios are clipped in log space, log r_t -> clip(log r_t, -eps_low, eps_high) (pessimistically:
    the clip only applies where it lowers sgn(A) * log r_t), the sequence ratio is their geometric mean
    R_i = exp(mean_t log r_t), and L = mean_i(-A_i R_i) with the sequence advantage A_i = mean_t A_t.
    The loss is a mean over sequences regardless of ``loss_agg_mode``; ``rollout_is_weights`` enter as the
    per-sequence mean weight. ``pg_clipfrac`` / ``pg_clipfrac_lower``: clipped-token fractions with A > 0 / A < 0.
    """
    eps_low, eps_high = _clip_ranges(config, "geo_mean")
    mask = response_mask.to(log_prob.dtype)
    log_ratio = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    ppo_kl = verl_F.masked_mean(-log_ratio, response_mask)

    sign = torch.sign(advantages)
    log_ratio_clipped = torch.clamp(log_ratio, -eps_low, eps_high)
    log_ratio_pess = sign * torch.minimum(sign * log_ratio, sign * log_ratio_clipped)

    length = mask.sum(dim=-1)
    seq_ratio = torch.exp(verl_F.masked_sum(log_ratio_pess, mask, axis=-1) / (length + 1e-8))
    seq_adv = verl_F.masked_sum(advantages, mask, axis=-1) / (length + 1e-8)
    pg_losses = -seq_adv * seq_ratio
    if rollout_is_weights is not None:
        pg_losses = pg_losses * verl_F.masked_sum(rollout_is_weights, mask, axis=-1) / (length + 1e-8)
    pg_loss = pg_losses.mean()

    clipped = (log_ratio != log_ratio_clipped).float()
    pg_clipfrac = verl_F.masked_mean(clipped * (advantages > 0), response_mask)
    pg_clipfrac_lower = verl_F.masked_mean(clipped * (advantages < 0), response_mask)
    return pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower


@register_policy_loss("cispo")
def compute_policy_loss_cispo(
    old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None, rollout_is_weights=None
):
    """CISPO (MiniMax 2025, "MiniMax-M1"): clipped importance-sampling weight, stop-gradient, times log pi.

        L_t = -sg[clip(r_t, 1 - eps_low, 1 + eps_high)] * A_t * log pi(y_t)

    Unlike PPO no token is dropped from the gradient; only its weight is bounded. The paper has no lower
    bound on the IS weight (only 1 + eps_high); set ``clip_ratio_low >= 1`` to reproduce it. ``pg_clipfrac`` /
    ``pg_clipfrac_lower``: fraction of tokens whose ratio is above 1 + eps_high / below 1 - eps_low.
    """
    eps_low, eps_high = _clip_ranges(config, "cispo")
    log_ratio = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    ratio = torch.exp(log_ratio)
    ppo_kl = verl_F.masked_mean(-log_ratio, response_mask)

    is_weight = torch.clamp(ratio, 1 - eps_low, 1 + eps_high).detach()
    pg_losses = -is_weight * advantages * log_prob
    pg_loss = agg_loss(_weighted(pg_losses, rollout_is_weights), response_mask, loss_agg_mode)

    pg_clipfrac = verl_F.masked_mean((ratio > 1 + eps_high).float(), response_mask)
    pg_clipfrac_lower = verl_F.masked_mean((ratio < 1 - eps_low).float(), response_mask)
    return pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower


@register_policy_loss("sapo")
def compute_policy_loss_sapo(
    old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None, rollout_is_weights=None
):
    """SAPO (Qwen 2025, "Soft Adaptive Policy Optimization", arXiv 2511.20347): a smooth gate instead of the hard clip.

        L_t = -f(r_t) * A_t,   f(r) = sigmoid(tau * (r - 1)) * 4 / tau,   tau = tau_pos if A_t > 0 else tau_neg

    (``actor.tau_pos`` / ``actor.tau_neg``). At r = 1 the gate's slope is 1, so the gradient equals the
    policy-gradient one there; away from it the gradient fades smoothly instead of dropping to zero at
    1 +- eps. The paper averages per sequence (``loss_agg_mode=seq-mean-token-mean``); the configured mode is used.
    No token is clipped: ``pg_clipfrac`` and ``pg_clipfrac_lower`` are 0.
    """
    config = _actor_config(config, "sapo")
    tau_pos, tau_neg = float(config.tau_pos), float(config.tau_neg)
    log_ratio = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    ratio = torch.exp(log_ratio)
    tau = torch.where(advantages > 0, torch.full_like(advantages, tau_pos), torch.full_like(advantages, tau_neg))
    gate = torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)
    pg_loss = agg_loss(_weighted(-gate * advantages, rollout_is_weights), response_mask, loss_agg_mode)
    ppo_kl = verl_F.masked_mean(-log_ratio, response_mask)
    return pg_loss, _zero(pg_loss), ppo_kl, _zero(pg_loss)


# --------------------------------------------------------------------------------------------------------------
# entropy and value losses
# --------------------------------------------------------------------------------------------------------------
def compute_entropy_loss(logits: torch.Tensor, response_mask: torch.Tensor, loss_agg_mode: str = "token-mean"):
    """Mean policy entropy H(pi(.|s_t)) over response tokens (the PPO entropy bonus, Schulman et al. 2017);
    ``logits`` is (B, L, V)."""
    return agg_loss(verl_F.entropy_from_logits(logits), response_mask, loss_agg_mode)


def compute_value_loss(
    vpreds: torch.Tensor,
    returns: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    cliprange_value: float,
    loss_agg_mode: str = "token-mean",
):
    """Clipped value loss (PPO, Schulman et al. 2017; as in OpenAI baselines).

        V_clip = clip(V_new, V_old - c, V_old + c);  L = 0.5 * max((V_new - R)^2, (V_clip - R)^2)

    Returns ``(vf_loss, vf_clipfrac)``, the fraction of tokens where the clipped error is the larger one.
    """
    vpred_clipped = verl_F.clip_by_value(vpreds, values - cliprange_value, values + cliprange_value)
    err_unclipped = (vpreds - returns) ** 2
    err_clipped = (vpred_clipped - returns) ** 2
    vf_loss = 0.5 * agg_loss(torch.maximum(err_unclipped, err_clipped), response_mask, loss_agg_mode)
    vf_clipfrac = verl_F.masked_mean((err_clipped > err_unclipped).float(), response_mask)
    return vf_loss, vf_clipfrac
