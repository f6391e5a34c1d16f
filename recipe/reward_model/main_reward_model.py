"""Reward-model training: ``python -m recipe.reward_model.main_reward_model key=value ...``
(config: ``config/reward_model_trainer.yaml``; see ``rm_trainer.py`` for the features)."""

import hydra
from omegaconf import DictConfig

from recipe.reward_model.rm_trainer import RewardModelTrainer
from verl.trainer.preference.check_config import check_config_if_asked, check_recipe_command_line
from verl.trainer.recipe_driver import quiet_searchpath_warning, run_recipe


def check_command_line(argv: list[str]) -> RewardModelTrainer:
    """What ``--check-config`` checks, in this process: the driver built from this command line (nothing
    started), or a ConfigError naming the key."""
    return check_recipe_command_line(argv, __file__, "reward_model_trainer", RewardModelTrainer)


@hydra.main(config_path="config", config_name="reward_model_trainer", version_base=None)
def main(config: DictConfig) -> None:
    run_recipe(config, RewardModelTrainer)


if __name__ == "__main__":
    quiet_searchpath_warning()
    check_config_if_asked(check_command_line)  # --check-config: check, print, exit 0 / 2
    main()
