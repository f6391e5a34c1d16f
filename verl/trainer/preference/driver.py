"""The recipe driver base under its earlier import path; it lives in :mod:`verl.trainer.recipe_driver`."""

from verl.trainer.recipe_driver import (EXIT_CONFIG_ERROR, RecipeDriver, batch_indices, build_recipe_driver,
                                        epoch_order, make_recipe_driver, run_recipe)
from verl.utils.config import ConfigError, quiet_searchpath_warning

__all__ = ["RecipeDriver", "epoch_order", "batch_indices", "make_recipe_driver", "build_recipe_driver", "run_recipe",
           "EXIT_CONFIG_ERROR", "ConfigError", "quiet_searchpath_warning"]
