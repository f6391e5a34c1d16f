"""DAPO: ``python -m recipe.dapo.main_dapo key=value ...`` (config: ``config/dapo_trainer.yaml``; the step is in
``dapo_ray_trainer.py``).

The PPO entry point's checks apply unchanged (unknown keys, batch arithmetic, files), plus DAPO's own rules
(:func:`check_dapo_config`); a problem prints one ``Config error: ...`` line and exits with code 2 before Ray or any
worker starts.
"""

from __future__ import annotations

import difflib
import os
import sys

import hydra
from omegaconf import DictConfig, OmegaConf

from recipe.dapo.dynamic_sampling import check_filter_groups
from verl.trainer.check_config import check_config_if_asked, compose_cli, raise_config_error
from verl.trainer.config_schema import validate_ppo_config
from verl.trainer.host_defaults import resolve_host_defaults
from verl.trainer.main_ppo import config_error_exit, precheck_cli, run_ppo
from verl.utils.config import ConfigError, quiet_searchpath_warning

CONFIG_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "config")
OVERLONG_KEYS = ("enable", "len", "penalty_factor", "log")


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_overlong_buffer(key: str, cfg, max_response_length: int, reward_manager: str) -> None:
    """``reward_model.overlong_buffer`` (or verl's ``reward_model.reward_kwargs.overlong_buffer_cfg``)."""
    if cfg is None:
        return
    if not isinstance(cfg, dict):
        raise ConfigError(f"{key} must be a mapping with keys {', '.join(OVERLONG_KEYS)}; got {cfg!r}")
    for name in cfg:
        if name not in OVERLONG_KEYS:
            close = difflib.get_close_matches(str(name), OVERLONG_KEYS, n=1)
            hint = f" (did you mean '{key}.{close[0]}'?)" if close else f"; known: {', '.join(OVERLONG_KEYS)}"
            raise ConfigError(f"unknown config key '{key}.{name}'{hint}")
    length, factor = cfg.get("len", 0), cfg.get("penalty_factor", 0.0)
    if isinstance(length, bool) or not isinstance(length, int) or length < 0:
        raise ConfigError(f"{key}.len={length!r} must be an integer >= 0 (tokens before data.max_response_length "
                          "where the penalty ramps up)")
    if not _number(factor) or factor < 0:
        raise ConfigError(f"{key}.penalty_factor={factor!r} must be a number >= 0 (the penalty at the full length)")
    for flag in ("enable", "log"):
        if not isinstance(cfg.get(flag, False), bool):
            raise ConfigError(f"{key}.{flag}={cfg.get(flag)!r} must be true or false")
    if not cfg.get("enable", False):
        return
    if length == 0 or length > max_response_length:
        raise ConfigError(f"{key}.enable=True needs 0 < {key}.len <= data.max_response_length "
                          f"({max_response_length}); got len={length}")
    if reward_manager != "dapo":
        raise ConfigError(f"{key}.enable=True: the overlong penalty is applied by the dapo reward manager, but "
                          f"reward_model.reward_manager={reward_manager!r}; set reward_model.reward_manager=dapo")


def check_dapo_config(config: DictConfig) -> None:
    """DAPO's rules, before anything starts: ``data.gen_batch_size``, ``algorithm.filter_groups``, the overlong
    buffer. Raises :class:`ConfigError` naming the key."""
    train_bsz = OmegaConf.select(config, "data.train_batch_size")
    gen_bsz = OmegaConf.select(config, "data.gen_batch_size", default=None)
    gen_bsz = train_bsz if gen_bsz is None else gen_bsz
    filter_cfg = OmegaConf.select(config, "algorithm.filter_groups", default=None) or {}
    enabled = filter_cfg.get("enable", False)
    if not isinstance(enabled, bool):
        raise ConfigError(f"algorithm.filter_groups.enable={enabled!r} must be true or false")
    if isinstance(gen_bsz, bool) or not isinstance(gen_bsz, int) or gen_bsz < 1:
        raise ConfigError(f"data.gen_batch_size={gen_bsz!r} must be a positive integer (prompts per generation round)")
    if gen_bsz < train_bsz:
        raise ConfigError(f"data.gen_batch_size={gen_bsz} is smaller than data.train_batch_size={train_bsz}: a "
                          "generation round must be able to fill a step; set data.gen_batch_size >= "
                          f"{train_bsz} (DAPO draws 3x train_batch_size)")
    if gen_bsz != train_bsz and not enabled:
        raise ConfigError(f"data.gen_batch_size={gen_bsz} differs from data.train_batch_size={train_bsz} but "
                          "algorithm.filter_groups.enable=False: without dynamic sampling every generated prompt is "
                          "trained on; set data.gen_batch_size to data.train_batch_size or enable filter_groups")
    if enabled:
        check_filter_groups(filter_cfg.get("metric", None), filter_cfg.get("max_num_gen_batches", 0),
                            int(OmegaConf.select(config, "actor_rollout_ref.rollout.n")),
                            bool(OmegaConf.select(config, "algorithm.use_kl_in_reward", default=False)))

    max_len = int(OmegaConf.select(config, "data.max_response_length"))
    manager = OmegaConf.select(config, "reward_model.reward_manager", default="naive")
    kwargs_cfg = OmegaConf.select(config, "reward_model.reward_kwargs.overlong_buffer_cfg", default=None)
    if kwargs_cfg is not None:  # verl's main_ppo spelling; it wins over reward_model.overlong_buffer
        check_overlong_buffer("reward_model.reward_kwargs.overlong_buffer_cfg", _plain(kwargs_cfg), max_len, manager)
    else:
        check_overlong_buffer("reward_model.overlong_buffer",
                              _plain(OmegaConf.select(config, "reward_model.overlong_buffer", default=None)),
                              max_len, manager)


def _plain(node):
    return OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node


@hydra.main(config_path="config", config_name="dapo_trainer", version_base=None)
def main(config: DictConfig) -> None:
    try:
        check_dapo_config(config)
    except ConfigError as e:
        config_error_exit(e)
    # named, not imported: the trainer loads inside the TaskRunner's Ray actor, not in this process
    run_ppo(config, task_runner_class="recipe.dapo.dapo_ray_trainer:DAPOTaskRunner")


def check_command_line(argv: list[str]) -> DictConfig:
    """What ``python -m recipe.dapo.main_dapo --check-config key=value ...`` checks, in this process: what ``main``
    checks before Ray starts (command line, composition, DAPO keys, host-aware defaults, the config validator).
    ``argv``: the command line without the flag. Returns the config; raises :class:`ConfigError` naming the key."""
    args = ["--config-path", CONFIG_DIR, "--config-name", "dapo_trainer", *argv]
    raise_config_error(precheck_cli, args)
    config = compose_cli(args, CONFIG_DIR, "dapo_trainer")
    check_dapo_config(config)
    explicit = {o.split("=", 1)[0].lstrip("+~") for o in argv if not o.startswith("-")}
    print(resolve_host_defaults(config, explicit), flush=True)
    validate_ppo_config(config)
    return config


if __name__ == "__main__":
    quiet_searchpath_warning()
    check_config_if_asked(check_command_line)  # --check-config: check, print, exit 0 / 2
    precheck_cli(["--config-path", CONFIG_DIR, "--config-name", "dapo_trainer", *sys.argv[1:]])
    main()
