"""Offline DPO: ``python -m recipe.dpo.main_dpo key=value ...`` (config: ``config/dpo_trainer.yaml``; see
``dpo_trainer.py`` for the features). Config and data problems (unknown loss type, batch arithmetic, bad
preference rows) print one ``Config error: ...`` line and exit with code 2 before any worker starts."""

import hydra
from omegaconf import DictConfig

from recipe.dpo.dpo_trainer import DPOTrainer
from verl.trainer.preference.check_config import check_config_if_asked
from verl.trainer.preference.driver import quiet_searchpath_warning, run_recipe


@hydra.main(config_path="config", config_name="dpo_trainer", version_base=None)
def main(config: DictConfig) -> None:
    run_recipe(config, DPOTrainer)


if __name__ == "__main__":
    quiet_searchpath_warning()
    check_config_if_asked(__file__, "dpo_trainer", DPOTrainer)  # --check-config: check, print, exit 0 / 2
    main()
