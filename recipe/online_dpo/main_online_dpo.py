"""Online (iterative) DPO: ``python -m recipe.online_dpo.main_online_dpo key=value ...`` (config:
``config/online_dpo_trainer.yaml``).

Each step the policy samples ``actor_rollout_ref.rollout.n`` responses to each of ``data.train_batch_size``
prompts (the rollout engine; the hybrid engine pushes the newest weights first), the rule reward (or the reward
model) scores them, and every prompt whose samples do not all score the same gives one pair: its best sample
(chosen) against its worst (rejected) -- or, with ``online_dpo.pairs=all``, every two of its samples whose scores
differ. One DPO update on those pairs follows (``online_dpo.loss_type``, sigmoid by default, with
``online_dpo.beta``) against the reference of ``trainer.ref_update_freq`` (-1: the initial model). This is the
online AI-feedback loop of Guo et al. 2024 ("Direct Language Model Alignment from Online AI Feedback") and TRL's
OnlineDPOTrainer, with a scored pool of n samples instead of two.
"""

from __future__ import annotations

import time

import hydra
from omegaconf import DictConfig

from verl.trainer.preference.check_config import check_config_if_asked, check_recipe_command_line
from verl.trainer.recipe_driver import quiet_searchpath_warning, run_recipe
from verl.trainer.preference.online import (PAIRINGS, OnlinePreferenceDriver, check_sampling, make_pairs,
                                            train_prefixed)
from verl.trainer.preference.pairs import REF_KEY, PairwisePreferenceLoss
from verl.utils.config import ConfigError
from verl.utils.metric import reduce_metrics

__all__ = ["OnlineDPOTrainer", "check_config", "check_command_line"]


def check_config(config: DictConfig) -> PairwisePreferenceLoss:
    """The loss from ``online_dpo.*`` and the sampling keys, checked before any worker starts."""
    check_sampling(config, min_n=2)
    section = config.online_dpo
    pairing = section.get("pairs", "best_worst")
    if pairing not in PAIRINGS:
        raise ConfigError(f"online_dpo.pairs={pairing!r}: set best_worst (the best against the worst sample of each "
                          "prompt) or all (every two samples of a prompt whose scores differ)")
    try:
        return PairwisePreferenceLoss(str(section.loss_type), float(section.beta), float(section.label_smoothing))
    except ValueError as e:
        raise ConfigError(f"online_dpo: {e} (online_dpo.loss_type, online_dpo.beta, online_dpo.label_smoothing)") from None


class OnlineDPOTrainer(OnlinePreferenceDriver):
    """``__init__`` checks keys and loads the prompts (errors before any worker starts); ``step`` is one
    sample -> score -> pair -> DPO update iteration."""

    section = "online_dpo"
    micro_unit = "pairs"

    def __init__(self, config: DictConfig, tokenizer):
        self.loss = check_config(config)
        super().__init__(config, tokenizer)
        self.n = int(config.actor_rollout_ref.rollout.n)
        self.pairing = str(config.online_dpo.get("pairs", "best_worst"))
        self.load_prompts()

    def step(self) -> dict:
        start = time.perf_counter()
        samples, scores, metrics = self.sample_and_score()               # n samples per prompt, scored
        pairs = make_pairs(scores, self.n, self.pairing)                 # best vs worst (or all) per prompt
        groups = len(scores) // self.n
        tied = int((scores.reshape(groups, self.n).amax(-1) == scores.reshape(groups, self.n).amin(-1)).sum())
        metrics.update({"online_dpo/pairs": float(len(pairs)), "online_dpo/tied_prompts": float(tied)})
        if pairs:
            chosen, rejected = (samples.select_idxs([p[k] for p in pairs]) for k in (0, 1))
            metrics["online_dpo/chosen_score"] = float(scores[[p[0] for p in pairs]].mean())
            metrics["online_dpo/rejected_score"] = float(scores[[p[1] for p in pairs]].mean())
            batch = self.pair_batch(chosen, rejected)
            if batch is not None:
                batch.batch[REF_KEY] = self.reference_logps(batch, self.loss.average_logps)  # log pi_ref(y | x)
                out = self.policy.update_with_loss(self.loss, batch)    # -log sigmoid(beta * (h_w - h_l))
                metrics.update(train_prefixed(reduce_metrics(out.meta_info["metrics"])))
                metrics["online_dpo/trained_pairs"] = float(len(batch) // 2)
        metrics["timing_s/step"] = time.perf_counter() - start
        return metrics


def check_command_line(argv: list[str]) -> OnlineDPOTrainer:
    """What ``--check-config`` checks, in this process: the driver built from this command line (nothing
    started), or a ConfigError naming the key."""
    return check_recipe_command_line(argv, __file__, "online_dpo_trainer", OnlineDPOTrainer)


@hydra.main(config_path="config", config_name="online_dpo_trainer", version_base=None)
def main(config: DictConfig) -> None:
    run_recipe(config, OnlineDPOTrainer)


if __name__ == "__main__":
    quiet_searchpath_warning()
    check_config_if_asked(check_command_line)  # --check-config: check, print, exit 0 / 2
    main()
