"""Offline DPO: ``python -m recipe.dpo.main_dpo key=value ...`` (config: ``config/dpo_trainer.yaml``; see
``dpo_trainer.py`` for the features). Config and data problems (unknown loss type, batch arithmetic, bad
preference rows) print one ``Config error: ...`` line and exit with code 2 before any worker starts."""

import hydra
from omegaconf import DictConfig

from recipe.dpo.dpo_trainer import DPOTrainer
from verl.trainer.preference.check_config import check_config_if_asked, check_recipe_command_line
from verl.trainer.recipe_driver import quiet_searchpath_warning, run_recipe


def check_command_line(argv: list[str]) -> DPOTrainer:
    """What ``--check-config`` checks, in this process: the driver built from this command line (nothing
    started), or a ConfigError naming the key."""
    return check_recipe_command_line(argv, __file__, "dpo_trainer", DPOTrainer)


@hydra.main(config_path="config", config_name="dpo_trainer", version_base=None)
def main(config: DictConfig) -> None:
    run_recipe(config, DPOTrainer)


if __name__ == "__main__":
    quiet_searchpath_warning()
    check_config_if_asked(check_command_line)  # --check-config: check, print, exit 0 / 2
    main()
