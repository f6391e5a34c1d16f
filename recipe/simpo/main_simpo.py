"""SimPO, written as a user would write a new method on top of the library (docs/writing_a_recipe.md):
``python -m recipe.simpo.main_simpo key=value ...`` (config: ``config/simpo_trainer.yaml``).

SimPO (Meng et al. 2024, "SimPO: Simple Preference Optimization with a Reference-Free Reward") scores a response
by its *average* log-probability and asks the chosen one to beat the rejected one by a margin gamma:
``loss = -log sigmoid(beta * (avg_logp(y_w) - avg_logp(y_l)) - gamma)``. No reference model.
"""

from __future__ import annotations

from dataclasses import dataclass

import hydra
import torch.nn.functional as F
from omegaconf import DictConfig

from verl.trainer.preference import sequence_logps, split_pairs
from verl.trainer.preference.check_config import check_config_if_asked, check_recipe_command_line
from verl.trainer.recipe_driver import RecipeDriver, quiet_searchpath_warning, run_recipe
from verl.utils.metric import reduce_metrics
from verl.workers.preference_worker import PreferenceWorker


@dataclass(frozen=True)
class SimPOLoss:
    """The loss of one micro-batch of interleaved pairs (the engine calls it; it returns the pair mean)."""

    beta: float = 2.0
    gamma: float = 0.5

    def __call__(self, outputs, micro, ctx=None):
        avg_logps = sequence_logps(outputs["log_probs"], micro["response_mask"], average=True)
        chosen, rejected = split_pairs(avg_logps)
        loss = -F.logsigmoid(self.beta * (chosen - rejected) - self.gamma)
        return loss.mean(), {"simpo/loss": loss.detach().mean(),
                             "rewards/accuracies": (chosen > rejected).float().mean(),
                             "rewards/margins": self.beta * (chosen - rejected).detach().mean()}


class SimPOTrainer(RecipeDriver):
    def __init__(self, config: DictConfig, tokenizer):
        super().__init__(config)
        self.loss = SimPOLoss(float(config.simpo.beta), float(config.simpo.gamma))
        self.setup_pairs(tokenizer, config.simpo.micro_batch_size_per_gpu, micro_key="simpo.micro_batch_size_per_gpu")

    def init_workers(self) -> None:
        self.start_ray()
        self.policy = self.spawn("actor", PreferenceWorker, config=self.config.actor_rollout_ref, role="actor")

    def step(self) -> dict:
        pairs, _ = self.next_pairs()                         # [y_w, y_l] per prompt, interleaved
        out = self.policy.update_with_loss(self.loss, pairs)  # one optimizer step on the SimPO loss
        return reduce_metrics(out.meta_info["metrics"])


def check_command_line(argv: list[str]) -> SimPOTrainer:
    """What ``--check-config`` checks, in this process: the driver built from this command line (nothing
    started), or a ConfigError naming the key."""
    return check_recipe_command_line(argv, __file__, "simpo_trainer", SimPOTrainer)


@hydra.main(config_path="config", config_name="simpo_trainer", version_base=None)
def main(config: DictConfig) -> None:
    run_recipe(config, SimPOTrainer)


if __name__ == "__main__":
    quiet_searchpath_warning()
    check_config_if_asked(check_command_line)  # --check-config: check, print, exit 0 / 2
    main()
