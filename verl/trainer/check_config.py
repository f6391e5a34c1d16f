"""``--check-config`` for the entry points that compose a Hydra config: check a command line without running it.

``python -m <entry point> --check-config key=value ...`` composes the config exactly as the run would (the same
``--config-path`` / ``--config-name``), runs every check the entry point makes before it starts anything, then
prints ``config ok`` and exits 0, or prints the ``Config error: ...`` line(s) and exits 2. It starts no Ray
cluster and no process group, loads no model weights and writes nothing.

``verl.trainer.main_ppo``, ``verl.trainer.fsdp_sft_trainer`` and ``recipe.dapo.main_dapo`` have their own
``check_config_cli``; the other recipes call ``verl.trainer.preference.check_config.check_config_if_asked`` first
thing in their ``__main__`` block.
"""

from __future__ import annotations

import os
import sys

from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from verl.utils.config import ConfigError

__all__ = ["CHECK_FLAG", "EXIT_CONFIG_ERROR", "split_cli", "compose_cli", "config_error_exit"]

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


def config_error_exit(err: BaseException) -> None:
    print(f"Config error: {err}", file=sys.stderr, flush=True)
    sys.exit(EXIT_CONFIG_ERROR)
