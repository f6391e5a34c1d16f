"""Rejection-sampling fine-tuning (best-of-n, then SFT on the accepted samples, iterated):
``python -m recipe.rejection_sampling.main_rejection_sampling key=value ...`` (config:
``config/rejection_sampling_trainer.yaml``).

Each iteration (one driver step) samples ``actor_rollout_ref.rollout.n`` responses for each of
``data.train_batch_size`` prompts with the rollout engine, scores them with the rule reward (the configured
reward manager), keeps per prompt the ``rejection_sampling.keep_per_prompt`` best samples whose score is at least
``rejection_sampling.min_score``, and fine-tunes the policy on those with the token-mean negative log-likelihood
of their response tokens (``rejection_sampling.sft_epochs`` passes, ``sft_mini_batch_size`` samples per optimizer
step). The next iteration samples from the fine-tuned policy (the hybrid engine pushes the new weights).
This is the loop of RAFT (Dong et al. 2023) / ReST's Improve step (Gulcehre et al. 2023) and OpenRLHF's iterative
rejection sampling, here in one process group instead of separate generate / score / train jobs.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import hydra
import torch
from omegaconf import DictConfig

from verl.protocol import DataProto
from verl.trainer.fsdp_sft_trainer import sft_loss
from verl.trainer.ppo.reward import load_reward_manager
from verl.trainer.preference.check_config import check_config_if_asked, check_recipe_command_line
from verl.trainer.recipe_driver import RecipeDriver, quiet_searchpath_warning, run_recipe
from verl.trainer.preference.prompt_sampling import (prompt_sources, greedy_validation, sample_responses,
                                                    sequence_scores)
from verl.utils.config import ConfigError
from verl.workers.config.roles import typed_section
from verl.utils.metric import reduce_metrics
from verl.workers.engine import MicroBatchSpec, TrainSpec
from verl.workers.preference_worker import PreferenceWorker

__all__ = ["SFTLoss", "select_accepted", "check_config", "RejectionSamplingTrainer", "check_command_line"]

_TRAIN_KEYS = ("input_ids", "attention_mask", "position_ids", "responses", "response_mask")


@dataclass(frozen=True)
class SFTLoss:
    """The SFT trainer's loss (:func:`verl.trainer.fsdp_sft_trainer.sft_loss`: token-mean negative log-likelihood
    of the response tokens; ``weight_by="tokens"`` makes a step the token mean over the mini-batch), reported as
    ``actor/sft_loss``."""

    def __call__(self, outputs, micro, ctx=None):
        nll, _ = sft_loss(outputs, micro, ctx)
        return nll, {"actor/sft_loss": nll.detach()}


def select_accepted(scores: torch.Tensor, n: int, min_score: float, keep: int) -> list[int]:
    """Rows to fine-tune on: ``scores`` holds ``n`` consecutive samples per prompt; per prompt, the ``keep``
    highest-scoring samples with score >= ``min_score`` (ties: the earlier sample). Prompts with none give none."""
    if scores.numel() % n:
        raise ValueError(f"{scores.numel()} scores do not split into groups of n={n}")
    chosen = []
    for start in range(0, scores.numel(), n):
        group = [(-float(scores[start + i]), i) for i in range(n) if float(scores[start + i]) >= min_score]
        chosen += [start + i for _, i in sorted(group)[:keep]]
    return chosen


def check_config(config: DictConfig) -> None:
    """Recipe keys, checked before any worker starts (each error names its key)."""
    rs, rollout = config.rejection_sampling, config.actor_rollout_ref.rollout
    n = int(rollout.n)
    if n < 1:
        raise ConfigError(f"actor_rollout_ref.rollout.n={n}: sample at least 1 response per prompt")
    if not typed_section(rollout, "actor_rollout_ref.rollout").do_sample and n > 1:
        raise ConfigError("actor_rollout_ref.rollout.do_sample=false gives n identical greedy samples; set it to "
                          "true for best-of-n")
    keep = int(rs.keep_per_prompt)
    if not 1 <= keep <= n:
        raise ConfigError(f"rejection_sampling.keep_per_prompt={keep}: keep between 1 and "
                          f"actor_rollout_ref.rollout.n={n} samples per prompt")
    try:
        if not math.isfinite(float(rs.min_score)):
            raise ValueError
    except (TypeError, ValueError):
        raise ConfigError(f"rejection_sampling.min_score={rs.min_score!r}: set a finite number (a sample is "
                          "accepted when its score is at least this)") from None
    for key in ("sft_epochs", "sft_mini_batch_size", "micro_batch_size_per_gpu"):
        if int(rs[key]) < 1:
            raise ConfigError(f"rejection_sampling.{key}={rs[key]}: must be >= 1")


class RejectionSamplingTrainer(RecipeDriver):
    """``__init__`` checks keys and loads the prompts (errors before any worker starts); ``step`` is one
    sample -> score -> select -> fine-tune iteration."""

    def __init__(self, config: DictConfig, tokenizer):
        super().__init__(config)
        check_config(config)
        self.tokenizer, self.seed = tokenizer, int(self.trainer_config.seed or 0)
        self.world = int(config.trainer.n_gpus_per_node) * int(config.trainer.nnodes)
        self.prompts, self.val = prompt_sources(config.data, tokenizer, self.seed)
        self.reward_fn = load_reward_manager(config, tokenizer, num_examine=0)
        self.loss = SFTLoss()

    def init_workers(self) -> None:
        self.start_ray()
        self.policy = self.spawn("actor", PreferenceWorker, config=self.config.actor_rollout_ref, role="actor_rollout")

    # ------------------------------------------------------------------ the method
    def step(self) -> dict:
        start, rs = time.perf_counter(), self.config.rejection_sampling
        n = int(self.config.actor_rollout_ref.rollout.n)
        samples = sample_responses(self.policy, self.prompts.batch(self.global_steps))  # n samples per prompt
        scores, _ = sequence_scores(self.reward_fn, samples)                           # rule reward per sample
        kept = select_accepted(scores, n, float(rs.min_score), int(rs.keep_per_prompt))  # best of n above the bar
        metrics = {"critic/score/mean": float(scores.mean()),
                   "rejection_sampling/acceptance_rate": float((scores >= float(rs.min_score)).float().mean()),
                   "rejection_sampling/prompts_with_accepted": float(len({i // n for i in kept}) * n / len(scores)),
                   "rejection_sampling/kept_samples": float(len(kept)),
                   "response_length/mean": float(samples.batch["response_mask"].sum(-1).float().mean())}
        if kept:
            metrics["rejection_sampling/kept_score/mean"] = float(scores[kept].mean())
            metrics["rejection_sampling/kept_score/min"] = float(scores[kept].min())
            # SFT on the kept samples
            out = self.policy.update_with_loss(self.loss, self.sft_batch(samples.select_idxs(kept)))
            metrics.update(reduce_metrics(out.meta_info["metrics"]))
        metrics["timing_s/step"] = time.perf_counter() - start
        return metrics

    # ------------------------------------------------------------------ helpers
    def sft_batch(self, accepted: DataProto) -> DataProto:
        """The accepted samples as an SFT batch, padded to a multiple of the process count with rows whose
        response mask is zero (they add no loss and no tokens)."""
        batch = DataProto.from_dict({k: accepted.batch[k] for k in _TRAIN_KEYS})
        pad = -len(batch) % self.world
        if pad:
            filler = batch.select_idxs(list(range(pad)) if pad <= len(batch) else [0] * pad)
            filler.batch["response_mask"] = torch.zeros_like(filler.batch["response_mask"])
            batch = DataProto.concat([batch, filler])
        rs = self.config.rejection_sampling
        per_rank = len(batch) // self.world
        mini = max(1, min(per_rank, -(-int(rs.sft_mini_batch_size) // self.world)))
        batch.meta_info["train_spec"] = TrainSpec(
            mini_batch_size=mini, micro=MicroBatchSpec(int(rs.micro_batch_size_per_gpu)), epochs=int(rs.sft_epochs),
            shuffle=True, seed=self.seed + self.global_steps, weight_by="tokens", mask_key="response_mask",
            outputs=("log_probs",), grad_norm_key="actor/grad_norm")
        return batch

    def validate(self) -> dict:
        """Greedy answers on ``data.val_files``: the mean rule score per data source."""
        return greedy_validation(self.policy, self.val, self.reward_fn)


def check_command_line(argv: list[str]) -> RejectionSamplingTrainer:
    """What ``--check-config`` checks, in this process: the driver built from this command line (nothing
    started), or a ConfigError naming the key."""
    return check_recipe_command_line(argv, __file__, "rejection_sampling_trainer", RejectionSamplingTrainer)


@hydra.main(config_path="config", config_name="rejection_sampling_trainer", version_base=None)
def main(config: DictConfig) -> None:
    run_recipe(config, RejectionSamplingTrainer)


if __name__ == "__main__":
    quiet_searchpath_warning()
    check_config_if_asked(check_command_line)  # --check-config: check, print, exit 0 / 2
    main()
