"""SPIN, self-play fine-tuning: ``python -m recipe.spin.main_spin key=value ...`` (config:
``config/spin_trainer.yaml``).

Chen et al. 2024, "Self-Play Fine-Tuning Converts Weak Language Models to Strong Language Models": the policy
plays against its previous iterate on supervised data. Each step, for each of ``data.train_batch_size`` prompts of
``data.train_files`` (a prompt and its target response, ``data.response_key``), the policy generates
``actor_rollout_ref.rollout.n`` responses with the rollout engine; each forms a pair with the target response as
chosen and the generation as rejected, and the policy takes one DPO (logistic) step on the pairs with
``actor_rollout_ref.actor.dpo_beta`` against the reference -- the previous iterate, refreshed from the policy every
``trainer.ref_update_freq`` steps (1: the policy before this step's update). A generation identical to the target
gives a pair with no gradient; once the policy reproduces the data the game is at its fixed point.
Validation: ``val/greedy_match``, the share of held-out prompts whose greedy answer is the target.
"""

from __future__ import annotations

import math
import time

import hydra
import torch
from omegaconf import DictConfig

from verl.protocol import DataProto
from verl.trainer.preference.dataset import ResponseDataset
from verl.trainer.preference.check_config import check_config_if_asked, check_recipe_command_line
from verl.trainer.recipe_driver import batch_indices, quiet_searchpath_warning, run_recipe
from verl.trainer.preference.online import OnlinePreferenceDriver, check_sampling, train_prefixed
from verl.trainer.preference.pairs import REF_KEY, PairwisePreferenceLoss
from verl.trainer.preference.prompt_sampling import sample_responses
from verl.utils.config import ConfigError
from verl.utils.metric import reduce_metrics
from verl.workers.config.data import as_data_config

__all__ = ["SPINTrainer", "check_config", "same_response", "response_texts", "check_command_line"]


def check_config(config: DictConfig) -> PairwisePreferenceLoss:
    """The loss from ``actor_rollout_ref.actor.dpo_beta`` and the layout keys, before any worker starts."""
    check_sampling(config, min_n=1)
    beta = config.actor_rollout_ref.actor.get("dpo_beta", 0.1)
    try:
        beta = float(beta)
        if not (math.isfinite(beta) and beta > 0):
            raise ValueError
    except (TypeError, ValueError):
        raise ConfigError(f"actor_rollout_ref.actor.dpo_beta={beta!r}: set a number > 0 (the DPO temperature)") from None
    gen, data = int(config.actor_rollout_ref.rollout.response_length), int(config.data.max_response_length)
    if gen != data:
        raise ConfigError(f"actor_rollout_ref.rollout.response_length={gen} differs from data.max_response_length="
                          f"{data}: generated and target responses share one layout; set them equal")
    return PairwisePreferenceLoss("sigmoid", beta)


def same_response(a: DataProto, b: DataProto) -> torch.Tensor:
    """Per row, whether two batches hold the same response tokens (up to and including eos)."""
    mask_a, mask_b = a.batch["response_mask"].bool(), b.batch["response_mask"].bool()
    same_tokens = torch.where(mask_a, a.batch["responses"], -1) == torch.where(mask_b, b.batch["responses"], -1)
    return same_tokens.all(-1) & (mask_a == mask_b).all(-1)


def response_texts(tokenizer, batch: DataProto) -> list[str]:
    """Each row's response up to and including eos, decoded without special tokens."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    tokens = torch.where(batch.batch["response_mask"].bool(), batch.batch["responses"], pad)
    return tokenizer.batch_decode(tokens, skip_special_tokens=True)


class SPINTrainer(OnlinePreferenceDriver):
    """``__init__`` checks keys and loads the data (errors before any worker starts); ``step`` is one
    generate -> pair with the target -> DPO update iteration."""

    section = "spin"
    micro_unit = "pairs"

    def __init__(self, config: DictConfig, tokenizer):
        self.loss = check_config(config)
        super().__init__(config, tokenizer)
        data, typed = config.data, as_data_config(config.data)
        self.batch_size = int(typed.train_batch_size)
        self.train = ResponseDataset(data.train_files, tokenizer, data, int(typed.train_max_samples))
        self.val = (ResponseDataset(data.val_files, tokenizer, data, int(typed.val_max_samples))
                    if typed.val_files else None)
        batch_indices(len(self.train), self.batch_size, self.seed, 0)  # a batch larger than the data fails here

    def step(self) -> dict:
        start = time.perf_counter()
        idx = batch_indices(len(self.train), self.batch_size, self.seed, self.global_steps)
        generated = sample_responses(self.policy, self.train.prompts(idx))   # y' ~ pi_t(. | x), n per prompt
        per_prompt = len(generated) // len(idx)
        targets = self.train.targets([i for i in idx for _ in range(per_prompt)])  # y from the data
        metrics = {"spin/generated_equals_target": float(same_response(generated, targets).float().mean()),
                   "response_length/mean": float(generated.batch["response_mask"].sum(-1).float().mean())}
        batch = self.pair_batch(targets, generated)                         # chosen = data, rejected = self-play
        if batch is not None:
            batch.batch[REF_KEY] = self.reference_logps(batch)              # log pi_ref: the previous iterate
            out = self.policy.update_with_loss(self.loss, batch)
            metrics.update(train_prefixed(reduce_metrics(out.meta_info["metrics"])))
        metrics["timing_s/step"] = time.perf_counter() - start
        return metrics

    def validate(self) -> dict:
        """Share of held-out prompts whose greedy answer (up to eos) is the target response."""
        if self.val is None:
            return {}
        idx = list(range(len(self.val)))
        prompts = self.val.prompts(idx)
        out = sample_responses(self.policy, prompts, do_sample=False, validate=True)
        answers = response_texts(self.tokenizer, out)
        wanted = self.val.target_texts(idx)
        return {"val/greedy_match": sum(a.strip() == w.strip() for a, w in zip(answers, wanted)) / len(idx)}


def check_command_line(argv: list[str]) -> SPINTrainer:
    """What ``--check-config`` checks, in this process: the driver built from this command line (nothing
    started), or a ConfigError naming the key."""
    return check_recipe_command_line(argv, __file__, "spin_trainer", SPINTrainer)


@hydra.main(config_path="config", config_name="spin_trainer", version_base=None)
def main(config: DictConfig) -> None:
    run_recipe(config, SPINTrainer)


if __name__ == "__main__":
    quiet_searchpath_warning()
    check_config_if_asked(check_command_line)  # --check-config: check, print, exit 0 / 2
    main()
