"""``--check-config`` for the recipes run by :func:`verl.trainer.preference.driver.run_recipe` (see
:mod:`verl.trainer.check_config`): compose, build the recipe's driver (every check before Ray starts), then
``config ok`` / exit 0 or the ``Config error:`` line / exit 2."""

from __future__ import annotations

import os
import sys

from verl.trainer.check_config import CHECK_FLAG, compose_cli, config_error_exit
from verl.trainer.preference.driver import build_recipe_driver
from verl.utils.config import ConfigError

__all__ = ["recipe_check_config_cli", "check_config_if_asked"]


def recipe_check_config_cli(argv: list[str], config_dir: str, config_name: str, driver_cls) -> None:
    """A recipe run by ``verl.trainer.preference.driver.run_recipe``: compose, then
    :func:`~verl.trainer.preference.driver.build_recipe_driver` (config, model directory, tokenizer, data and
    batch checks of the recipe's driver), then ``config ok`` / exit 0 (errors: exit 2)."""
    try:
        config = compose_cli(argv, config_dir, config_name)
    except ConfigError as e:
        config_error_exit(e)
    build_recipe_driver(config, driver_cls)  # prints the Config error line and exits 2 itself
    print("config ok", flush=True)
    sys.exit(0)


def check_config_if_asked(module_file: str, config_name: str, driver_cls, argv: list[str] | None = None) -> None:
    """In a recipe's ``__main__``: when ``--check-config`` is on the command line, check it and exit (0 or 2);
    otherwise return and let the run start. ``module_file``: the recipe module's ``__file__`` (its ``config/``
    folder holds ``config_name``)."""
    argv = sys.argv[1:] if argv is None else argv
    if CHECK_FLAG not in argv:
        return
    config_dir = os.path.join(os.path.dirname(os.path.abspath(module_file)), "config")
    recipe_check_config_cli([a for a in argv if a != CHECK_FLAG], config_dir, config_name, driver_cls)
