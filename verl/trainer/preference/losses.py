"""Preference and distillation losses, written as their papers write them.

Every pairwise loss takes *sequence* log-probabilities (the sum of the response tokens' log-probs, or their
mean for IPO) of the policy and the reference, and returns ``(loss per pair, chosen reward, rejected reward)``
where the implicit reward of a response is ``beta * (log pi(y|x) - log pi_ref(y|x))`` (DPO's reparametrisation;
TRL reports the same quantities as ``rewards/chosen`` and ``rewards/rejected``). Means over the batch are the
caller's: the training engine weights each micro-batch by its share of the pairs.

============================  =====================================================================
``sigmoid`` (DPO)             Rafailov et al. 2023, "Direct Preference Optimization" (eq. 7)
``sigmoid`` + label_smoothing conservative DPO (cDPO), Mitchell 2023, "A note on DPO with noisy preferences"
``ipo``                       Azar et al. 2023, "A General Theoretical Paradigm to Understand Learning from
                              Human Preferences" (eq. 17)
``hinge``                     Zhao et al. 2023, "SLiC-HF: Sequence Likelihood Calibration with Human Feedback"
``kto``                       Ethayarajh et al. 2024, "KTO: Model Alignment as Prospect Theoretic Optimization"
``bradley_terry``             Bradley & Terry 1952; reward-model training as in Ouyang et al. 2022, with the
                              optional margin of Touvron et al. 2023 (Llama 2)
``generalized_jsd``           Agarwal et al. 2024, "On-Policy Distillation of Language Models" (GKD, eq. 2)
``sppo``                      Wu et al. 2024, "Self-Play Preference Optimization for Language Model Alignment"
                              (the squared loss of eq. 3.6 / Algorithm 1)
============================  =====================================================================
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["PAIRWISE_LOSSES", "pairwise_loss", "dpo_sigmoid_loss", "ipo_loss", "hinge_loss", "kto_loss",
           "bradley_terry_loss", "generalized_jsd", "reverse_kl", "sppo_loss", "preference_metrics", "kto_metrics",
           "same_prompt_accuracy"]


def _log_ratios(policy_chosen, policy_rejected, ref_chosen, ref_rejected):
    chosen = policy_chosen - ref_chosen
    rejected = policy_rejected - ref_rejected
    return chosen, rejected


def dpo_sigmoid_loss(policy_chosen, policy_rejected, ref_chosen, ref_rejected, beta: float = 0.1,
                     label_smoothing: float = 0.0):
    """DPO: ``-log sigmoid(beta * h)`` with ``h = (log pi/pi_ref)(y_w) - (log pi/pi_ref)(y_l)``.

    ``label_smoothing = eps > 0`` is conservative DPO: the preference label is taken as flipped with
    probability eps, ``-(1 - eps) log sigmoid(beta h) - eps log sigmoid(-beta h)``.
    """
    chosen, rejected = _log_ratios(policy_chosen, policy_rejected, ref_chosen, ref_rejected)
    logits = beta * (chosen - rejected)
    loss = -(1.0 - label_smoothing) * F.logsigmoid(logits) - label_smoothing * F.logsigmoid(-logits)
    return loss, beta * chosen.detach(), beta * rejected.detach()


def ipo_loss(policy_chosen, policy_rejected, ref_chosen, ref_rejected, beta: float = 0.1, label_smoothing=0.0):
    """IPO: ``(h - 1 / (2 beta))^2``, a squared loss that does not push ``h`` to infinity on deterministic
    preferences. Azar et al. use per-token *average* log-probs; the caller passes those."""
    chosen, rejected = _log_ratios(policy_chosen, policy_rejected, ref_chosen, ref_rejected)
    loss = (chosen - rejected - 1.0 / (2.0 * beta)) ** 2
    return loss, beta * chosen.detach(), beta * rejected.detach()


def hinge_loss(policy_chosen, policy_rejected, ref_chosen, ref_rejected, beta: float = 0.1, label_smoothing=0.0):
    """SLiC hinge: ``max(0, 1 - beta * h)`` (calibration margin 1/beta in log-ratio units)."""
    chosen, rejected = _log_ratios(policy_chosen, policy_rejected, ref_chosen, ref_rejected)
    loss = torch.relu(1.0 - beta * (chosen - rejected))
    return loss, beta * chosen.detach(), beta * rejected.detach()


PAIRWISE_LOSSES = {"sigmoid": dpo_sigmoid_loss, "ipo": ipo_loss, "hinge": hinge_loss}


def pairwise_loss(loss_type: str):
    """The pairwise loss named ``loss_type`` (a clear error listing the choices otherwise)."""
    try:
        return PAIRWISE_LOSSES[loss_type]
    except KeyError:
        raise ValueError(f"loss_type={loss_type!r} is not a pairwise preference loss; choose one of: "
                         f"{', '.join(sorted(PAIRWISE_LOSSES))} (kto takes unpaired data)") from None


def kto_loss(policy_logps, ref_logps, desirable, kl, beta: float = 0.1, desirable_weight: float = 1.0,
             undesirable_weight: float = 1.0):
    """KTO on unpaired completions: with ``r = log pi(y|x) - log pi_ref(y|x)`` and the reference point
    ``z = kl`` (an estimate of KL(pi || pi_ref), detached, clamped at 0),

    - desirable ``y``:   ``lambda_D * (1 - sigmoid(beta * (r - z)))``
    - undesirable ``y``: ``lambda_U * (1 - sigmoid(beta * (z - r)))``

    ``desirable`` is a bool tensor. Returns ``(loss per completion, reward beta * r)``.
    """
    r = policy_logps - ref_logps
    z = torch.as_tensor(kl, dtype=r.dtype, device=r.device).detach().clamp(min=0)
    good = desirable.bool()
    value = torch.where(good, desirable_weight * torch.sigmoid(beta * (r - z)),
                        undesirable_weight * torch.sigmoid(beta * (z - r)))
    weight = torch.where(good, torch.full_like(r, desirable_weight), torch.full_like(r, undesirable_weight))
    return weight - value, beta * r.detach()


def kto_metrics(rewards, policy_logps, desirable) -> dict:
    """TRL's KTO names: ``rewards/{chosen,rejected}`` and ``logps/{chosen,rejected}`` are means over the
    desirable / undesirable completions (a side with no rows is left out), ``rewards/margins`` their difference
    (only when both sides are present)."""
    good = desirable.bool()
    out = {}
    for name, rows in (("chosen", good), ("rejected", ~good)):
        if rows.any():
            out[f"rewards/{name}"] = rewards[rows].detach().mean()
            out[f"logps/{name}"] = policy_logps[rows].detach().mean()
    if "rewards/chosen" in out and "rewards/rejected" in out:
        out["rewards/margins"] = out["rewards/chosen"] - out["rewards/rejected"]
    return out


def same_prompt_accuracy(prompts: list, rewards, desirable) -> float | None:
    """Share of (desirable, undesirable) completion pairs of the *same* prompt in which the desirable one has
    the larger implicit reward (strictly): the pairwise ``rewards/accuracies`` of DPO read off unpaired data.
    ``prompts`` holds one hashable key per row. None when no prompt has both kinds of completion."""
    groups: dict = {}
    for key, r, good in zip(prompts, rewards.tolist(), desirable.bool().tolist()):
        groups.setdefault(key, ([], []))[0 if good else 1].append(r)
    wins = total = 0
    for good_r, bad_r in groups.values():
        for g in good_r:
            for b in bad_r:
                wins += g > b
                total += 1
    return wins / total if total else None


def bradley_terry_loss(chosen_scores, rejected_scores, margin=None):
    """Reward-model loss ``-log sigmoid(r(y_w) - r(y_l) - m)``; ``m`` is an optional per-pair margin
    (how much better the chosen response was rated), 0 when None."""
    diff = chosen_scores - rejected_scores
    if margin is not None:
        diff = diff - margin
    return -F.logsigmoid(diff)


def generalized_jsd(student_logits, teacher_logits, beta: float = 0.5, temperature: float = 1.0):
    """Per-token generalized Jensen-Shannon divergence of GKD over the vocabulary (last dim):

    ``JSD_beta(P || Q) = beta KL(P || M) + (1 - beta) KL(Q || M)``, ``M = beta P + (1 - beta) Q``,
    ``P`` the teacher, ``Q`` the student. Divided by beta it tends to the forward KL as beta -> 0, and divided
    by 1 - beta to the reverse KL as beta -> 1; the end points are those KLs, as in TRL's GKD trainer:
    ``beta = 0`` gives ``KL(P || Q)`` and ``beta = 1`` gives ``KL(Q || P)``.
    """
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"generalized_jsd needs 0 <= beta <= 1, got {beta}")
    log_q = F.log_softmax(student_logits / temperature, dim=-1)
    log_p = F.log_softmax(teacher_logits / temperature, dim=-1)
    if beta == 0.0:
        return (log_p.exp() * (log_p - log_q)).sum(-1)
    if beta == 1.0:
        return (log_q.exp() * (log_q - log_p)).sum(-1)
    log_m = torch.logsumexp(torch.stack([log_p + torch.log(torch.tensor(beta, dtype=log_p.dtype)),
                                         log_q + torch.log(torch.tensor(1.0 - beta, dtype=log_q.dtype))]), dim=0)
    kl_p_m = (log_p.exp() * (log_p - log_m)).sum(-1)
    kl_q_m = (log_q.exp() * (log_q - log_m)).sum(-1)
    return beta * kl_p_m + (1.0 - beta) * kl_q_m


def reverse_kl(student_logits, teacher_logits, temperature: float = 1.0):
    """Per-token reverse KL ``KL(Q_student || P_teacher) = sum_v q (log q - log p)`` (mode seeking)."""
    log_q = F.log_softmax(student_logits / temperature, dim=-1)
    log_p = F.log_softmax(teacher_logits / temperature, dim=-1)
    return (log_q.exp() * (log_q - log_p)).sum(-1)


def sppo_loss(policy_logps, ref_logps, win_prob, eta: float = 1.0):
    """SPPO per response: ``(log pi(y|x) - log pi_ref(y|x) - eta * (P(y > pi_ref | x) - 1/2))^2``.

    ``win_prob`` is the estimated probability that ``y`` beats a response of the reference (the policy that
    sampled it). The loss pulls the log-ratio of a response that wins more than half of its comparisons up to
    ``eta * (P - 1/2)`` and of one that loses down, instead of pushing margins to infinity.
    Returns ``(loss per response, log-ratio)``.
    """
    ratio = policy_logps - ref_logps
    target = eta * (win_prob.to(ratio.dtype) - 0.5)
    return (ratio - target) ** 2, ratio.detach()


def preference_metrics(chosen_rewards, rejected_rewards, policy_chosen, policy_rejected) -> dict:
    """TRL's names: ``rewards/{chosen,rejected,accuracies,margins}``, ``logps/{chosen,rejected}`` (means)."""
    return {
        "rewards/chosen": chosen_rewards.mean(),
        "rewards/rejected": rejected_rewards.mean(),
        "rewards/accuracies": (chosen_rewards > rejected_rewards).float().mean(),
        "rewards/margins": (chosen_rewards - rejected_rewards).mean(),
        "logps/chosen": policy_chosen.detach().mean(),
        "logps/rejected": policy_rejected.detach().mean(),
    }
