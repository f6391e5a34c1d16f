"""DAPO: ``python -m recipe.dapo.main_dapo key=value ...`` (config: ``config/dapo_trainer.yaml``; the step is in
``dapo_ray_trainer.py``).

The PPO entry point's checks apply unchanged (unknown keys, batch arithmetic, files), plus DAPO's own rules
(:func:`check_dapo_config`); a problem prints one ``Config error: ...`` line and exits with code 2 before Ray or any
worker starts.
"""

from __future__ import annotations

import os
import sys

import hydra
from omegaconf import DictConfig
from omegaconf.errors import OmegaConfBaseException

from recipe.dapo.dynamic_sampling import check_filter_groups
from verl.trainer.check_config import check_config_if_asked, compose_cli, raise_config_error
from verl.trainer.config_schema import validate_ppo_config
from verl.trainer.config_schema.ppo import PPOTrainerConfig
from verl.trainer.config_schema.spec import build
from verl.trainer.host_defaults import resolve_host_defaults
from verl.trainer.main_ppo import config_error_exit, precheck_cli, run_ppo
from verl.utils.config import ConfigError, quiet_searchpath_warning
from verl.workers.reward_manager.dapo import overlong_buffer_config

CONFIG_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "config")


def check_overlong_buffer(key: str, cfg, max_response_length: int, reward_manager: str) -> None:
    """``reward_model.overlong_buffer`` (or verl's ``reward_model.reward_kwargs.overlong_buffer_cfg``): its keys,
    types and ranges (the reward manager's typed config), then what an enabled buffer needs."""
    if cfg is None:
        return
    buffer = overlong_buffer_config(cfg, key)
    if not buffer.enable:
        return
    if buffer.len == 0 or buffer.len > max_response_length:
        raise ConfigError(f"{key}.enable=True needs 0 < {key}.len <= data.max_response_length "
                          f"({max_response_length}); got len={buffer.len}")
    if reward_manager != "dapo":
        raise ConfigError(f"{key}.enable=True: the overlong penalty is applied by the dapo reward manager, but "
                          f"reward_model.reward_manager={reward_manager!r}; set reward_model.reward_manager=dapo")


def check_dapo_config(config: DictConfig) -> None:
    """DAPO's rules, before anything starts: ``data.gen_batch_size``, ``algorithm.filter_groups``, the overlong
    buffer. Raises :class:`ConfigError` naming the key."""
    # the composed config as typed sections (keys it leaves out take the schema's defaults); the PPO validator
    # checks the rest of it after these rules
    try:
        typed = build(PPOTrainerConfig, config)
    except OmegaConfBaseException as e:  # a broken interpolation such as ${trainer.nonexistent}
        raise ConfigError(f"config interpolation failed: {e}") from None
    data, algorithm, reward_model = typed.data, typed.algorithm, typed.reward_model
    train_bsz = data.train_batch_size
    gen_bsz = train_bsz if data.gen_batch_size is None else data.gen_batch_size
    filter_groups = algorithm.filter_groups
    enabled = filter_groups.enable
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
        check_filter_groups(filter_groups.metric, filter_groups.max_num_gen_batches,
                            int(typed.actor_rollout_ref.rollout.n), bool(algorithm.use_kl_in_reward))

    max_len = int(data.max_response_length)
    kwargs_cfg = reward_model.reward_kwargs.get("overlong_buffer_cfg")
    if kwargs_cfg is not None:  # verl's main_ppo spelling; it wins over reward_model.overlong_buffer
        check_overlong_buffer("reward_model.reward_kwargs.overlong_buffer_cfg", kwargs_cfg, max_len,
                              reward_model.reward_manager)
    else:
        check_overlong_buffer("reward_model.overlong_buffer", reward_model.overlong_buffer, max_len,
                              reward_model.reward_manager)


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
