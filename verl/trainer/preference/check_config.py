"""``--check-config`` for the recipes run by :func:`verl.trainer.recipe_driver.run_recipe` (see
:mod:`verl.trainer.check_config`): compose, build the recipe's driver (every check before Ray starts), then
``config ok`` / exit 0 or the ``Config error:`` line / exit 2.

Each recipe's module defines ``check_command_line(argv)`` with :func:`check_recipe_command_line` and calls
``check_config_if_asked(check_command_line)`` first thing in its ``__main__`` block."""

from __future__ import annotations

import os

from verl.trainer.check_config import check_config_if_asked, compose_cli
from verl.trainer.recipe_driver import make_recipe_driver

__all__ = ["check_recipe_command_line", "check_config_if_asked"]


def check_recipe_command_line(argv: list[str], module_file: str, config_name: str, driver_cls):
    """What ``--check-config`` checks for a recipe, in this process: compose the command line ``argv`` (without the
    flag) against ``config/<config_name>.yaml`` next to ``module_file`` (the recipe module's ``__file__``), then
    :func:`~verl.trainer.recipe_driver.make_recipe_driver` (config, model directory, tokenizer, data and batch
    checks of ``driver_cls``). Returns the driver, which has started nothing; raises
    :class:`~verl.utils.config.ConfigError` naming the key."""
    config_dir = os.path.join(os.path.dirname(os.path.abspath(module_file)), "config")
    config = compose_cli(argv, config_dir, config_name)
    return make_recipe_driver(config, driver_cls)
