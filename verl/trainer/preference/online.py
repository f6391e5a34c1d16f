"""Online preference learning: the policy samples, a reward scores, preferences are built from the scores and
the policy is updated against a reference. Shared by ``recipe/online_dpo``, ``recipe/spin`` and ``recipe/sppo``.

- :func:`best_worst_pairs`: per prompt, the best- and worst-scored of its ``n`` samples (online DPO);
  :func:`all_pairs`: every pair of a prompt's samples whose scores differ (``online_dpo.pairs=all``);
- :func:`win_probabilities`: per sample, the estimated probability that it beats another sample of the same
  prompt (SPPO's ``P(y > pi_t | x)``), from indicator wins or a Bradley-Terry model of the scores;
- :class:`SPPOLoss`: SPPO's squared loss as an engine loss function;
- :class:`OnlinePreferenceDriver`: a :class:`~verl.trainer.recipe_driver.RecipeDriver` with the policy worker
  group (rollout + actor, and a reference model when needed), the reference schedule of
  ``trainer.ref_update_freq`` and batch layouts whose size changes from step to step.

The reference (``trainer.ref_update_freq``): ``-1`` keeps the initial model for the whole run (online DPO as in
Guo et al. 2024 / TRL); ``k >= 1`` makes it the policy of ``k`` steps ago, refreshed from the actor every ``k``
steps -- the previous iterate of SPIN (Chen et al. 2024) and SPPO (Wu et al. 2024). ``k = 1`` needs no second
model: the reference log-probs are the actor's, taken before the step's update.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import torch
from omegaconf import DictConfig

from verl.protocol import DataProto
from verl.trainer.ppo.reward import load_reward_manager
from verl.trainer.recipe_driver import RecipeDriver
from verl.trainer.preference.losses import sppo_loss
from verl.trainer.preference.pairs import REF_KEY, interleave_pairs, sequence_logps
from verl.trainer.preference.prompt_sampling import (prompt_sources, greedy_validation, sample_responses,
                                                    sequence_scores)
from verl.utils.config import ConfigError
from verl.workers.config.roles import typed_section
from verl.workers.engine import MicroBatchSpec, TrainSpec
from verl.workers.preference_worker import PreferenceWorker

__all__ = ["best_worst_pairs", "all_pairs", "make_pairs", "PAIRINGS", "win_probabilities", "WIN_RATE_KINDS", "SPPOLoss", "OnlinePreferenceDriver",
           "TRAIN_KEYS", "check_positive_int", "check_sampling"]

PAIRINGS = ("best_worst", "all")
TRAIN_KEYS = ("input_ids", "attention_mask", "position_ids", "responses", "response_mask")
WIN_RATE_KINDS = ("indicator", "bradley_terry")


def _groups(scores: torch.Tensor, n: int) -> torch.Tensor:
    if n < 2:
        raise ValueError(f"n={n}: comparing samples of a prompt needs at least 2 per prompt")
    if scores.numel() % n:
        raise ValueError(f"{scores.numel()} scores do not split into groups of n={n}")
    return scores.reshape(-1, n)


def best_worst_pairs(scores: torch.Tensor, n: int) -> list[tuple[int, int]]:
    """``scores`` holds ``n`` consecutive samples per prompt; per prompt ``(best row, worst row)`` (ties: the
    earlier sample). Prompts whose samples all score the same give no pair."""
    pairs = []
    for g, group in enumerate(_groups(scores, n).tolist()):
        hi, lo = max(group), min(group)
        if hi != lo:
            pairs.append((g * n + group.index(hi), g * n + group.index(lo)))
    return pairs


def all_pairs(scores: torch.Tensor, n: int) -> list[tuple[int, int]]:
    """``scores`` holds ``n`` consecutive samples per prompt; per prompt every ``(higher row, lower row)`` of two
    samples with different scores (``k`` right and ``n - k`` wrong samples give ``k (n - k)`` pairs), in row
    order of the higher then the lower sample. Tied samples are never paired."""
    pairs = []
    for g, group in enumerate(_groups(scores, n).tolist()):
        for i, hi in enumerate(group):
            pairs.extend((g * n + i, g * n + j) for j, lo in enumerate(group) if hi > lo)
    return pairs


def make_pairs(scores: torch.Tensor, n: int, pairing: str = "best_worst") -> list[tuple[int, int]]:
    """(chosen row, rejected row) pairs by ``pairing``: ``best_worst`` (one per prompt) or ``all``."""
    if pairing == "best_worst":
        return best_worst_pairs(scores, n)
    if pairing == "all":
        return all_pairs(scores, n)
    raise ValueError(f"pairing {pairing!r} is not one of: {', '.join(PAIRINGS)}")


def win_probabilities(scores: torch.Tensor, n: int, kind: str = "indicator") -> torch.Tensor:
    """Per sample ``y_i`` of a prompt, the mean over the prompt's other samples ``y_j`` of ``P(y_i > y_j)``:

    - ``indicator``: 1 if ``s_i > s_j``, 1/2 on a tie, 0 otherwise (a prompt's values average to 1/2);
    - ``bradley_terry``: ``sigmoid(s_i - s_j)`` (scores read as Bradley-Terry rewards, e.g. a reward model's).

    Returns float64 values of shape ``scores.shape``.
    """
    if kind not in WIN_RATE_KINDS:
        raise ValueError(f"win rate kind {kind!r} is not one of: {', '.join(WIN_RATE_KINDS)}")
    s = _groups(scores, n).double()
    diff = s[:, :, None] - s[:, None, :]
    p = torch.sigmoid(diff) if kind == "bradley_terry" else (diff > 0).double() + 0.5 * (diff == 0).double()
    others = 1.0 - torch.eye(n, dtype=torch.float64)
    return ((p * others).sum(-1) / (n - 1)).reshape(-1)


@dataclass(frozen=True)
class SPPOLoss:
    """SPPO on rows carrying ``ref_logps`` (the reference's sequence log-prob) and ``win_prob``; the mean over
    responses (``weight_by="sequences"``)."""

    eta: float = 1.0

    def __post_init__(self):
        if not (math.isfinite(self.eta) and self.eta > 0):
            raise ValueError(f"actor_rollout_ref.actor.sppo_eta={self.eta}: set a finite number > 0")

    def __call__(self, outputs: dict, micro, ctx=None):
        logps = sequence_logps(outputs["log_probs"], micro["response_mask"])
        win = micro["win_prob"].to(logps.dtype)
        loss, ratio = sppo_loss(logps, micro[REF_KEY].to(logps.dtype), win, self.eta)
        metrics = {"sppo/loss": loss.detach().mean(), "sppo/log_ratio": ratio.mean(),
                   "logps/policy": logps.detach().mean()}
        for name, rows in (("winners", win > 0.5), ("losers", win < 0.5)):
            if rows.any():
                metrics[f"sppo/log_ratio/{name}"] = ratio[rows].mean()
        return loss.mean(), metrics


def check_positive_int(section: DictConfig, key: str, prefix: str) -> int:
    try:
        value = int(section[key])
    except (TypeError, ValueError):
        value = None
    if value is None or value < 1:
        raise ConfigError(f"{prefix}.{key}={section[key]!r}: set an integer >= 1")
    return value


def check_sampling(config: DictConfig, min_n: int) -> int:
    """``actor_rollout_ref.rollout.n`` (at least ``min_n``) with sampling on when it is above 1."""
    rollout = config.actor_rollout_ref.rollout
    n = int(rollout.n)
    if n < min_n:
        raise ConfigError(f"actor_rollout_ref.rollout.n={n}: this recipe compares samples of the same prompt; "
                          f"sample at least {min_n} per prompt")
    if n > 1 and not typed_section(rollout, "actor_rollout_ref.rollout").do_sample:
        raise ConfigError(f"actor_rollout_ref.rollout.do_sample=false gives {n} identical greedy samples per "
                          "prompt; set it to true")
    return n


class OnlinePreferenceDriver(RecipeDriver):
    """What the online recipes share; see the module docstring. A subclass sets ``section`` (its config section,
    holding ``micro_batch_size_per_gpu``) and writes ``step``."""

    section = ""
    micro_unit = "rows"

    def __init__(self, config: DictConfig, tokenizer):
        super().__init__(config)
        self.tokenizer = tokenizer
        self.seed = int(self.trainer_config.seed or 0)
        self.world = int(config.trainer.n_gpus_per_node) * int(config.trainer.nnodes)
        self.micro = check_positive_int(config[self.section], "micro_batch_size_per_gpu", self.section)
        if typed_section(config.actor_rollout_ref.actor, "actor_rollout_ref.actor").use_dynamic_bsz:
            raise ConfigError("actor_rollout_ref.actor.use_dynamic_bsz=true packs rows by token count; this recipe "
                              f"uses fixed micro-batches of {self.section}.micro_batch_size_per_gpu {self.micro_unit}"
                              "; set it to false")
        self.ref_update_freq = self._check_ref_update_freq(config)
        self._ref_epoch = 0  # global_steps // ref_update_freq when the reference was last set

    @staticmethod
    def _check_ref_update_freq(config: DictConfig) -> int:
        raw = config.trainer.get("ref_update_freq", -1)
        try:
            freq = int(raw)
        except (TypeError, ValueError):
            freq = 0
        if freq == 0 or str(raw).strip() not in (str(freq), f"{freq}.0"):
            raise ConfigError(f"trainer.ref_update_freq={raw!r}: set -1 (the initial model stays the reference) or "
                              "an integer k >= 1 (the reference is refreshed from the policy every k steps)")
        lora = int(typed_section(config.actor_rollout_ref.model, "actor_rollout_ref.model").lora_rank or 0)
        if freq > 1 and lora > 0:
            raise ConfigError(f"trainer.ref_update_freq={freq} with actor_rollout_ref.model.lora_rank={lora}: a LoRA "
                              "policy's reference is its base model (adapters off) and cannot be refreshed; use "
                              "trainer.ref_update_freq=1 (the previous step's policy) or -1 (the base model)")
        return freq

    def load_prompts(self) -> None:
        """``data.train_files`` / ``data.val_files`` as RL prompts (verl's parquet schema) and the reward."""
        self.prompts, self.val = prompt_sources(self.config.data, self.tokenizer, self.seed)
        self.reward_fn = load_reward_manager(self.config, self.tokenizer, num_examine=0)

    def init_workers(self) -> None:
        self.start_ray()
        role = "actor_rollout" if self.ref_update_freq == 1 else "actor_rollout_ref"
        self.policy = self.spawn("actor", PreferenceWorker, config=self.config.actor_rollout_ref, role=role)

    # ------------------------------------------------------------------ the reference
    def reference_logps(self, batch: DataProto, average: bool = False) -> torch.Tensor:
        """Sequence log-probs of ``batch``'s responses under the reference of this step (refreshed first when a
        ``trainer.ref_update_freq`` boundary has passed)."""
        data = DataProto.from_dict({k: batch.batch[k] for k in TRAIN_KEYS}, meta_info={"average": average})
        if self.ref_update_freq == 1:  # the previous iterate is the actor before this step's update
            return self.call(self.policy, "compute_seq_logps", data).batch["logps"]
        if self.ref_update_freq > 1 and self.global_steps // self.ref_update_freq != self._ref_epoch:
            self.refresh_reference()
        return self.call(self.policy, "compute_ref_seq_logps", data).batch["ref_logps"]

    def refresh_reference(self) -> None:
        self.policy.sync_ref_from_actor()
        self._ref_epoch = self.global_steps // self.ref_update_freq
        print(f"step {self.global_steps}: the reference policy is now the current policy", flush=True)

    def load_checkpoint(self) -> int:
        step = super().load_checkpoint()
        freq = self.ref_update_freq
        if step and freq > 1:
            if step % freq == 0:
                self._ref_epoch = step // freq - 1  # refreshed at the next step, as without the interruption
            else:
                warnings.warn(f"resumed at step {step}, not a multiple of trainer.ref_update_freq={freq}: the "
                              f"reference becomes the step-{step} policy (an uninterrupted run used the step-"
                              f"{step - step % freq} policy); checkpoint at multiples of it (trainer.save_freq) for "
                              "an exact resume", stacklevel=1)
                self.refresh_reference()
        return step

    # ------------------------------------------------------------------ batches
    def pair_batch(self, chosen: DataProto, rejected: DataProto) -> DataProto | None:
        """Interleaved ``[chosen_i, rejected_i, ...]`` training rows and their TrainSpec (one optimizer step over
        all pairs); pairs beyond a multiple of the process count are dropped. None when no pair is left."""
        keep = len(chosen) - len(chosen) % self.world
        if keep == 0:
            return None
        sides = []
        for side in (chosen, rejected):
            rows = side.select_idxs(list(range(keep)))
            tensors = {k: rows.batch[k] for k in TRAIN_KEYS}
            tensors["response_mask"] = tensors["response_mask"].float()
            sides.append(DataProto.from_dict(tensors))
        batch = interleave_pairs(*sides)
        batch.meta_info["train_spec"] = self.train_spec(len(batch), 2 * self.micro)
        return batch

    def train_spec(self, rows: int, micro_rows: int) -> TrainSpec:
        return TrainSpec(mini_batch_size=rows // self.world, micro=MicroBatchSpec(micro_rows), epochs=1,
                         weight_by="sequences", mask_key="response_mask", outputs=("log_probs",),
                         grad_norm_key="actor/grad_norm")

    # ------------------------------------------------------------------ sampling and validation
    def sample_and_score(self) -> tuple[DataProto, torch.Tensor, dict]:
        """This step's prompts, ``rollout.n`` samples each, and their rule (or reward-model) scores."""
        samples = sample_responses(self.policy, self.prompts.batch(self.global_steps))
        scores, _ = sequence_scores(self.reward_fn, samples)
        metrics = {"critic/score/mean": float(scores.mean()), "critic/score/max": float(scores.max()),
                   "critic/score/min": float(scores.min()),
                   "response_length/mean": float(samples.batch["response_mask"].sum(-1).float().mean())}
        return samples, scores, metrics

    def validate(self) -> dict:
        """Greedy answers on ``data.val_files``: the mean score per data source."""
        return greedy_validation(self.policy, getattr(self, "val", None), self.reward_fn)


def train_prefixed(metrics: dict) -> dict:
    """``rewards/*`` and ``logps/*`` under ``train/`` (validation logs the same names under ``val/``)."""
    return {f"train/{k}" if k.startswith(("rewards/", "logps/")) else k: v for k, v in metrics.items()}
