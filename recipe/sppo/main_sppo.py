"""SPPO, self-play preference optimization: ``python -m recipe.sppo.main_sppo key=value ...`` (config:
``config/sppo_trainer.yaml``).

Wu et al. 2024, "Self-Play Preference Optimization for Language Model Alignment": each step the policy samples
``actor_rollout_ref.rollout.n`` responses to each of ``data.train_batch_size`` prompts, the reward scores them, and
each response's probability of beating the policy, ``P(y > pi_t | x)``, is estimated as its mean win rate against
the prompt's other samples (``sppo.win_rate``: ``indicator`` -- 1 for a higher score, 1/2 for a tie -- or
``bradley_terry`` -- ``sigmoid(s_i - s_j)``). The policy then takes one step on SPPO's squared loss

    (log pi(y|x) - log pi_t(y|x) - eta * (P(y > pi_t | x) - 1/2))^2

over all samples, with ``eta = actor_rollout_ref.actor.sppo_eta`` and ``pi_t`` the previous iterate (refreshed from
the policy every ``trainer.ref_update_freq`` steps; 1: the policy that sampled this step's responses).
"""

from __future__ import annotations

import time

import hydra
from omegaconf import DictConfig

from verl.protocol import DataProto
from verl.trainer.preference.check_config import check_config_if_asked, check_recipe_command_line
from verl.trainer.recipe_driver import quiet_searchpath_warning, run_recipe
from verl.trainer.preference.online import (TRAIN_KEYS, WIN_RATE_KINDS, OnlinePreferenceDriver, SPPOLoss,
                                            check_sampling, train_prefixed, win_probabilities)
from verl.trainer.preference.pairs import REF_KEY
from verl.utils.config import ConfigError
from verl.utils.metric import reduce_metrics

__all__ = ["SPPOTrainer", "check_config", "check_command_line"]


def check_config(config: DictConfig) -> SPPOLoss:
    """The loss from ``actor_rollout_ref.actor.sppo_eta``, ``sppo.win_rate`` and the sampling keys."""
    check_sampling(config, min_n=2)
    kind = str(config.sppo.win_rate)
    if kind not in WIN_RATE_KINDS:
        raise ConfigError(f"sppo.win_rate={kind!r} is not one of: {', '.join(WIN_RATE_KINDS)}")
    eta = config.actor_rollout_ref.actor.get("sppo_eta", 1.0)
    try:
        return SPPOLoss(float(eta))
    except (TypeError, ValueError) as e:
        raise ConfigError(str(e) if "sppo_eta" in str(e) else
                          f"actor_rollout_ref.actor.sppo_eta={eta!r}: set a finite number > 0") from None


class SPPOTrainer(OnlinePreferenceDriver):
    """``__init__`` checks keys and loads the prompts (errors before any worker starts); ``step`` is one
    sample -> score -> win probabilities -> SPPO update iteration."""

    section = "sppo"
    micro_unit = "responses"

    def __init__(self, config: DictConfig, tokenizer):
        self.loss = check_config(config)
        super().__init__(config, tokenizer)
        self.n = int(config.actor_rollout_ref.rollout.n)
        rows = int(config.data.train_batch_size) * self.n
        if rows % self.world:
            raise ConfigError(f"data.train_batch_size x actor_rollout_ref.rollout.n = {rows} samples must divide over "
                              f"{self.world} processes (trainer.n_gpus_per_node x trainer.nnodes)")
        self.load_prompts()

    def step(self) -> dict:
        start = time.perf_counter()
        samples, scores, metrics = self.sample_and_score()                   # n samples per prompt, scored
        win = win_probabilities(scores, self.n, str(self.config.sppo.win_rate))  # P(y > pi_t | x) per sample
        groups = scores.reshape(-1, self.n)
        metrics["sppo/decisive_prompts"] = float((groups.max(1).values > groups.min(1).values).float().mean())
        batch = DataProto.from_dict({k: samples.batch[k] for k in TRAIN_KEYS})
        batch.batch["response_mask"] = batch.batch["response_mask"].float()
        batch.batch["win_prob"] = win.float()
        batch.batch[REF_KEY] = self.reference_logps(batch)                  # log pi_t(y | x)
        batch.meta_info["train_spec"] = self.train_spec(len(batch), self.micro)
        out = self.policy.update_with_loss(self.loss, batch)                 # the squared loss, one step
        metrics.update(train_prefixed(reduce_metrics(out.meta_info["metrics"])))
        metrics["timing_s/step"] = time.perf_counter() - start
        return metrics


def check_command_line(argv: list[str]) -> SPPOTrainer:
    """What ``--check-config`` checks, in this process: the driver built from this command line (nothing
    started), or a ConfigError naming the key."""
    return check_recipe_command_line(argv, __file__, "sppo_trainer", SPPOTrainer)


@hydra.main(config_path="config", config_name="sppo_trainer", version_base=None)
def main(config: DictConfig) -> None:
    run_recipe(config, SPPOTrainer)


if __name__ == "__main__":
    quiet_searchpath_warning()
    check_config_if_asked(check_command_line)  # --check-config: check, print, exit 0 / 2
    main()
