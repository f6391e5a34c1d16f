"""``--check-config`` for the entry points that compose a Hydra config: check a command line without running it.

``python -m <entry point> --check-config key=value ...`` composes the config exactly as the run would (the same
``--config-path`` / ``--config-name``), runs every check the entry point makes before it starts anything, then
prints ``config ok`` and exits 0, or prints the ``Config error: ...`` line(s) and exits 2. It starts no Ray
cluster and no process group, loads no model weights and writes nothing.

``verl.trainer.main_ppo`` and ``verl.trainer.fsdp_sft_trainer`` have their own ``check_config_cli``; the recipes
call :func:`check_config_if_asked` first thing in their ``__main__`` block.
"""

from __future__ import annotations

import os
import sys

from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from verl.utils.config import ConfigError

__all__ = ["CHECK_FLAG", "EXIT_CONFIG_ERROR", "split_cli", "compose_cli", "check_config_if_asked",
           "recipe_check_config_cli"]

CHECK_FLAG = "--check-config"
EXIT_CONFIG_ERROR = 2
_CHOICE_FLAGS = ("--config-name", "-cn", "--config-path", "-cp")


def split_cli(argv: list[str], config_dir: str, config_name: str) -> tuple[str, str, list[str]]:
    """(config dir, config name, overrides) of a Hydra command line; a relative ``--config-path`` is taken
    relative to the directory of ``config_dir`` (where the entry point's module lives). Other flags are dropped."""
    overrides = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if not arg.startswith("-"):
            overrides.append(arg)
        else:
            name, _, value = arg.partition("=")
            if name in _CHOICE_FLAGS:
                if not value and i + 1 < len(argv):
                    i += 1
                    value = argv[i]
                if name in ("--config-name", "-cn"):
                    config_name = value
                else:
                    config_dir = value if os.path.isabs(value) else os.path.join(os.path.dirname(config_dir), value)
        i += 1
    return config_dir, config_name, [o for o in overrides if not o.lstrip("+~").startswith("hydra")]


def compose_cli(argv: list[str], config_dir: str, config_name: str) -> DictConfig:
    """The config the run would get from this command line; Hydra's refusals become one-line ConfigErrors."""
    config_dir, config_name, overrides = split_cli(argv, config_dir, config_name)
    try:
        with initialize_config_dir(config_dir=config_dir, version_base=None):
            return compose(config_name=config_name, overrides=overrides)
    except Exception as e:  # unknown key, wrong type, missing config: as Hydra words it, minus the traceback
        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
        raise ConfigError(" ".join(lines)) from None


def _fail(err: BaseException) -> None:
    print(f"Config error: {err}", file=sys.stderr, flush=True)
    sys.exit(EXIT_CONFIG_ERROR)


def recipe_check_config_cli(argv: list[str], config_dir: str, config_name: str, driver_cls) -> None:
    """A recipe run by ``verl.trainer.preference.driver.run_recipe``: compose, then
    :func:`~verl.trainer.preference.driver.build_recipe_driver` (config, model directory, tokenizer, data and
    batch checks of the recipe's driver), then ``config ok`` / exit 0 (errors: exit 2)."""
    from verl.trainer.preference.driver import build_recipe_driver

    try:
        config = compose_cli(argv, config_dir, config_name)
    except ConfigError as e:
        _fail(e)
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
