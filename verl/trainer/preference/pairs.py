"""Pairs in the engine's layout, and the preference losses as engine loss functions.

A batch of ``P`` preference pairs is ``2P`` rows, interleaved ``[chosen_0, rejected_0, chosen_1, ...]``: the
engine cuts mini- and micro-batches at even row counts, so a pair never straddles two micro-batches (dynamic
batch sizes, which pack rows by tokens, could split one and are refused). Losses are means over the pairs of a
micro-batch with ``weight_by="sequences"``, so every pair weighs the same in an optimizer step.

The loss objects are plain picklable callables: a driver builds one on the controller and sends it with the
data to the workers (``PreferenceWorker.update_with_loss``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from verl.protocol import DataProto
from verl.trainer.preference.losses import (bradley_terry_loss, kto_loss, kto_metrics, pairwise_loss,
                                            preference_metrics)
from verl.workers.engine import MicroBatchSpec, TrainSpec

__all__ = ["interleave_pairs", "split_pairs", "sequence_logps", "last_token_scores", "pair_train_spec",
           "PairwisePreferenceLoss", "KTOLoss", "kto_reference_point", "BradleyTerryLoss", "REF_KEY"]

REF_KEY = "ref_logps"  # per-row reference sequence log-prob, precomputed once (offline) or per step (online)


def interleave_pairs(chosen: DataProto, rejected: DataProto) -> DataProto:
    """``[c0, r0, c1, r1, ...]`` from two equally long batches with the same tensor keys and shapes."""
    if len(chosen) != len(rejected):
        raise ValueError(f"{len(chosen)} chosen rows but {len(rejected)} rejected rows")
    both = DataProto.concat([chosen, rejected])
    n = len(chosen)
    order = torch.stack([torch.arange(n), torch.arange(n) + n], dim=1).reshape(-1)
    return both.select_idxs(order.numpy())


def split_pairs(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(chosen, rejected) halves of an interleaved row tensor."""
    if rows.shape[0] % 2:
        raise ValueError(f"an interleaved pair batch needs an even number of rows, got {rows.shape[0]}")
    return rows[0::2], rows[1::2]


def sequence_logps(log_probs: torch.Tensor, mask: torch.Tensor, average: bool = False) -> torch.Tensor:
    """Sum (or mean, for IPO) of the response tokens' log-probs per row."""
    total = (log_probs * mask).sum(-1)
    return total / mask.sum(-1).clamp(min=1.0) if average else total


def last_token_scores(scores: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """A sequence classifier's score at each row's last valid token (right padding or left padding)."""
    positions = torch.arange(attention_mask.shape[1], device=attention_mask.device)
    last = (attention_mask.long() * positions).argmax(dim=-1)
    return scores[torch.arange(scores.shape[0], device=scores.device), last]


def pair_train_spec(mini_batch_pairs: int, micro_batch_pairs: int, use_dynamic_bsz: bool = False,
                    outputs: tuple[str, ...] = ("log_probs",), epochs: int = 1,
                    key_prefix: str = "preference") -> TrainSpec:
    """A TrainSpec that keeps pairs whole: row counts are 2x the pair counts; dynamic batch sizes refused."""
    if use_dynamic_bsz:
        raise ValueError(f"{key_prefix}: use_dynamic_bsz=True packs rows by token count and could split a "
                         "chosen/rejected pair across micro-batches; set use_dynamic_bsz=False and a fixed "
                         "micro-batch size (pairs)")
    if micro_batch_pairs <= 0 or mini_batch_pairs % micro_batch_pairs:
        raise ValueError(f"{key_prefix}: the micro-batch ({micro_batch_pairs} pairs) must be > 0 and divide the "
                         f"mini-batch ({mini_batch_pairs} pairs per rank)")
    return TrainSpec(mini_batch_size=2 * mini_batch_pairs, micro=MicroBatchSpec(2 * micro_batch_pairs),
                     epochs=epochs, shuffle=False, weight_by="sequences", mask_key="response_mask",
                     outputs=outputs, grad_norm_key="actor/grad_norm")


@dataclass(frozen=True)
class PairwisePreferenceLoss:
    """DPO / cDPO / IPO / hinge on an interleaved micro-batch whose rows carry ``ref_logps``."""

    loss_type: str = "sigmoid"
    beta: float = 0.1
    label_smoothing: float = 0.0

    def __post_init__(self):
        pairwise_loss(self.loss_type)  # unknown names fail here, on the controller
        if self.beta <= 0:
            raise ValueError(f"beta must be > 0, got {self.beta}")
        if not 0.0 <= self.label_smoothing < 0.5:
            raise ValueError(f"label_smoothing must be in [0, 0.5), got {self.label_smoothing}")

    @property
    def average_logps(self) -> bool:
        return self.loss_type == "ipo"

    def __call__(self, outputs: dict, micro, ctx=None):
        logps = sequence_logps(outputs["log_probs"], micro["response_mask"], self.average_logps)
        pol_c, pol_r = split_pairs(logps)
        ref_c, ref_r = split_pairs(micro[REF_KEY].to(logps.dtype))
        loss, rew_c, rew_r = pairwise_loss(self.loss_type)(pol_c, pol_r, ref_c, ref_r, beta=self.beta,
                                                            label_smoothing=self.label_smoothing)
        metrics = preference_metrics(rew_c, rew_r, pol_c, pol_r)
        metrics["actor/dpo_loss"] = loss.detach().mean()
        return loss.mean(), metrics


def kto_reference_point(policy_logps, ref_logps):
    """KTO's reference point z from mismatched rows (a prompt with another row's completion): the mean
    log-ratio ``log pi(y'|x) - log pi_ref(y'|x)``, an estimate of KL(pi || pi_ref), clamped at 0 and detached."""
    return (policy_logps.detach() - ref_logps.detach()).mean().clamp(min=0)


@dataclass(frozen=True)
class KTOLoss:
    """KTO (Ethayarajh et al. 2024) on unpaired completions, laid out like pairs: rows ``[y_0, y'_0, y_1, y'_1,
    ...]`` where ``y_i`` is a completion of prompt ``x_i`` with ``label`` (1 desirable, 0 undesirable) and
    ``y'_i`` is ``x_i`` with a completion of a different prompt (the dataset's mismatched row). Every row
    carries ``ref_logps``. The reference point z is estimated per micro-batch from the mismatched rows
    (``kto_reference_point``: no gradient, clamped at 0); the loss is ``kto_loss`` averaged over the ``y_i``."""

    beta: float = 0.1
    desirable_weight: float = 1.0
    undesirable_weight: float = 1.0

    def __post_init__(self):
        if self.beta <= 0:
            raise ValueError(f"beta must be > 0, got {self.beta}")
        for name in ("desirable_weight", "undesirable_weight"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")

    @property
    def average_logps(self) -> bool:
        return False

    def rows(self, logps, ref_logps, labels):
        """(loss per completion, reward per completion, z, policy logps of the completions, desirable mask) from
        interleaved per-row sequence log-probs."""
        pol, pol_kl = split_pairs(logps)
        ref, ref_kl = split_pairs(ref_logps.to(logps.dtype))
        good = split_pairs(labels)[0].bool()
        z = kto_reference_point(pol_kl, ref_kl)
        loss, reward = kto_loss(pol, ref, good, z, self.beta, self.desirable_weight, self.undesirable_weight)
        return loss, reward, z, pol, good

    def __call__(self, outputs: dict, micro, ctx=None):
        logps = sequence_logps(outputs["log_probs"], micro["response_mask"])
        loss, reward, z, pol, good = self.rows(logps, micro[REF_KEY], micro["label"])
        metrics = kto_metrics(reward, pol, good)
        metrics["kl"] = z
        metrics["actor/kto_loss"] = loss.detach().mean()
        return loss.mean(), metrics


@dataclass(frozen=True)
class BradleyTerryLoss:
    """Reward-model training on interleaved pairs: the head's score at the last valid token; optional
    per-row ``margin`` (read from the chosen rows)."""

    use_margin: bool = False

    def __call__(self, outputs: dict, micro, ctx=None):
        scores = last_token_scores(outputs["scores"], micro["attention_mask"])
        chosen, rejected = split_pairs(scores)
        margin = split_pairs(micro["margin"].to(scores.dtype))[0] if self.use_margin else None
        loss = bradley_terry_loss(chosen, rejected, margin)
        return loss.mean(), {"rm/loss": loss.detach().mean(), "rm/accuracy": (chosen > rejected).float().mean(),
                             "rm/chosen_score": chosen.detach().mean(), "rm/rejected_score": rejected.detach().mean()}
