"""``--check-config`` for the entry points that compose a Hydra config: check a command line without running it.

``python -m <entry point> --check-config key=value ...`` composes the config exactly as the run would (the same
``--config-path`` / ``--config-name``), runs every check the entry point makes before it starts anything, then
prints ``config ok`` and exits 0, or prints the ``Config error: ...`` line(s) and exits 2. It starts no Ray
cluster and no process group, loads no model weights and writes nothing.

Each entry point (``verl.trainer.main_ppo`` aside, which has its own ``check_config_cli``) has a
``check_command_line(argv)`` function: it runs those checks in the calling process and returns, or raises
:class:`~verl.utils.config.ConfigError` naming the key, so that scripts and tests can check many command lines
without starting an interpreter for each. The ``__main__`` block calls :func:`check_config_if_asked` with it, which
only adds the printing and the exit code. The recipes run by ``verl.trainer.recipe_driver.run_recipe`` build
theirs with :func:`verl.trainer.preference.check_config.check_recipe_command_line`.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
from typing import Callable, NoReturn, TypeVar

from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from verl.utils.config import ConfigError

__all__ = ["CHECK_FLAG", "EXIT_CONFIG_ERROR", "split_cli", "compose_cli", "config_error_exit", "raise_config_error",
           "check_config_cli", "check_config_if_asked"]

T = TypeVar("T")

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


def config_error_exit(err: BaseException) -> NoReturn:
    print(f"Config error: {err}", file=sys.stderr, flush=True)
    sys.exit(EXIT_CONFIG_ERROR)


def raise_config_error(fn: Callable[..., T], *args, **kwargs) -> T:
    """``fn(*args, **kwargs)`` for a function that reports a config problem the command-line way (a
    ``Config error: ...`` line on stderr and exit code 2): its result, or that problem as a :class:`ConfigError`
    carrying the message. Whatever else it writes to stderr (warnings) is passed on."""
    prefix = "Config error: "
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return fn(*args, **kwargs)
    except SystemExit as e:
        if e.code != EXIT_CONFIG_ERROR:
            raise
        reports = [ln[len(prefix):] for ln in err.getvalue().splitlines() if ln.startswith(prefix)]
        raise ConfigError(reports[-1] if reports else f"{getattr(fn, '__name__', fn)} exited with code 2") from None
    finally:
        passed_on = "".join(ln for ln in err.getvalue().splitlines(keepends=True) if not ln.startswith(prefix))
        if passed_on:
            sys.stderr.write(passed_on)
            sys.stderr.flush()


def check_config_cli(check: Callable[[list[str]], object], argv: list[str]) -> NoReturn:
    """``--check-config``'s output: ``check(argv)`` (an entry point's ``check_command_line``), then ``config ok``
    and exit 0, or the ``Config error:`` line and exit 2."""
    try:
        check(argv)
    except ConfigError as e:
        config_error_exit(e)
    print("config ok", flush=True)
    sys.exit(0)


def check_config_if_asked(check: Callable[[list[str]], object], argv: list[str] | None = None) -> None:
    """First thing in an entry point's ``__main__``: when ``--check-config`` is on the command line (``argv``,
    default ``sys.argv[1:]``), check the rest of it with ``check`` and exit 0 / 2; otherwise return and let the run
    start."""
    argv = sys.argv[1:] if argv is None else argv
    if CHECK_FLAG in argv:
        check_config_cli(check, [a for a in argv if a != CHECK_FLAG])
