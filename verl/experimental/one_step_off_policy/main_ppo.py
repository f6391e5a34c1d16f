"""One-step-off-policy entry point: ``python -m verl.experimental.one_step_off_policy.main_ppo key=value ...``
(config: ``config/one_step_off_ppo_trainer.yaml``; the step schedule is in ``ray_trainer.py``).

The PPO entry point's checks apply unchanged (unknown keys, batch arithmetic, files), plus this mode's rules
(:func:`check_one_step_off_config`): ``actor_rollout_ref.hybrid_engine`` must be false, the two pools must fit the
machine, the strategy must be fsdp/fsdp2 and the advantage estimator must not need a second generation (remax). A
problem prints one ``Config error: ...`` line and exits with code 2 before Ray or any worker starts.
"""

from __future__ import annotations

import os
import sys
from functools import partial

import hydra
import torch
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from verl.experimental.one_step_off_policy.ray_trainer import OneStepOffRayTrainer
from verl.trainer.config_schema.one_step_off import OneStepOffConfig, RolloutPool
from verl.trainer.config_schema.spec import build
from verl.trainer.main_ppo import TaskRunner, config_error_exit, precheck_cli, run_ppo
from verl.trainer.recipe_driver import quiet_searchpath_warning
from verl.utils.config import ConfigError

CONFIG_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "config")
CONFIG_NAME = "one_step_off_ppo_trainer"
def typed_one_step_off_config(config: DictConfig) -> OneStepOffConfig:
    """``config`` typed once (keys it leaves out take the schema's defaults)."""
    try:
        return build(OneStepOffConfig, config)
    except OmegaConfBaseException as e:  # a broken interpolation such as ${trainer.nonexistent}
        raise ConfigError(f"config interpolation failed: {e}") from None


def _positive_int(key: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{key}={value!r} must be a positive integer")
    return value


def _devices_per_node(device: str) -> int:
    if device == "cuda" and torch.cuda.is_available():
        return torch.cuda.device_count()
    return os.cpu_count() or 1


def check_one_step_off_config(config: DictConfig, typed: OneStepOffConfig | None = None) -> RolloutPool:
    """This mode's rules, before anything starts; returns the rollout pool. Raises :class:`ConfigError`.
    ``typed``: ``config`` already typed (:func:`typed_one_step_off_config`)."""
    typed = typed if typed is not None else typed_one_step_off_config(config)
    arr, trainer, pool = typed.actor_rollout_ref, typed.trainer, typed.rollout
    if arr.hybrid_engine:
        raise ConfigError("actor_rollout_ref.hybrid_engine=True: one-step-off-policy training runs the rollout on "
                          "its own pool (rollout.n_gpus_per_node processes); set actor_rollout_ref.hybrid_engine="
                          "False, or train with python -m verl.trainer.main_ppo for the colocated hybrid engine")
    strategy = arr.actor.strategy
    if strategy not in ("fsdp", "fsdp2"):
        raise ConfigError(f"actor_rollout_ref.actor.strategy={strategy!r}: one-step-off-policy training supports "
                          "fsdp and fsdp2")
    if typed.algorithm.adv_estimator == "remax":
        raise ConfigError("algorithm.adv_estimator=remax needs a greedy generation with the current weights every "
                          "step, which a one-step-off rollout cannot give; use grpo, rloo or gae")
    if not isinstance(pool.overlap, bool):
        raise ConfigError(f"rollout.overlap={pool.overlap!r} must be true or false")
    _positive_int("rollout.nnodes", pool.nnodes)
    _positive_int("rollout.n_gpus_per_node", pool.n_gpus_per_node)
    trainer_nodes = _positive_int("trainer.nnodes", trainer.nnodes)
    trainer_per_node = _positive_int("trainer.n_gpus_per_node", trainer.n_gpus_per_node)
    if pool.nnodes == 1 and trainer_nodes == 1:
        device = str(trainer.device)
        device = "cuda" if device == "auto" and torch.cuda.is_available() else ("cpu" if device == "auto" else device)
        have = _devices_per_node(device)
        unit = "GPUs" if device == "cuda" else "CPU cores (a CPU 'gpu' is a worker process)"
        if trainer_per_node + pool.n_gpus_per_node > have:
            raise ConfigError(f"trainer.n_gpus_per_node={trainer_per_node} + rollout.n_gpus_per_node="
                              f"{pool.n_gpus_per_node} processes do not fit this machine's {have} {unit}: the "
                              "training and rollout pools need separate devices; lower one of them")
    return pool


def shared_ppo_config(config: DictConfig, typed: OneStepOffConfig | None = None) -> DictConfig:
    """The config the PPO trainer's own validation and workers see: the top-level ``rollout`` pool is removed
    (it sizes the extra pool, passed separately), ``hybrid_engine`` and ``rollout.calculate_log_probs`` are put
    back to the values the shared schema describes (the colocated default; the engine's log-probs are always
    returned), and Ray gets a CPU slot for every process of both pools. ``typed``: ``config`` already typed."""
    typed = typed if typed is not None else typed_one_step_off_config(config)
    out = OmegaConf.create(OmegaConf.to_container(config, resolve=False))
    pool_procs = int(typed.rollout.nnodes) * int(typed.rollout.n_gpus_per_node)
    with open_dict(out):
        del out["rollout"]
        out.actor_rollout_ref.hybrid_engine = True
        out.actor_rollout_ref.rollout.calculate_log_probs = False
        out.actor_rollout_ref.rollout.free_cache_engine = True
        if typed.ray_init.num_cpus is None:
            trainer_procs = int(typed.trainer.nnodes) * int(typed.trainer.n_gpus_per_node)
            out.ray_init.num_cpus = max(os.cpu_count() or 1, trainer_procs + pool_procs + 1)
    return out


class OneStepOffTaskRunner(TaskRunner):
    """The PPO task runner with :class:`OneStepOffRayTrainer` (the rollout pool set by :func:`main`)."""

    rollout_pool: RolloutPool | None = None

    def run(self, config: DictConfig, placement: str = "colocate") -> None:
        self.trainer_cls = partial(OneStepOffRayTrainer, rollout_pool_spec=self.rollout_pool.spec,
                                   overlap=self.rollout_pool.overlap)
        super().run(config, placement)


def runner_for(pool: RolloutPool) -> type:
    return type("OneStepOffTaskRunner", (OneStepOffTaskRunner,), {"rollout_pool": pool})


@hydra.main(config_path=CONFIG_DIR, config_name=CONFIG_NAME, version_base=None)
def main(config: DictConfig) -> None:
    try:
        typed = typed_one_step_off_config(config)
        pool = check_one_step_off_config(config, typed)
    except ConfigError as e:
        config_error_exit(e)
    run_ppo(shared_ppo_config(config, typed), task_runner_class=runner_for(pool))


if __name__ == "__main__":
    quiet_searchpath_warning()
    precheck_cli(["--config-path", CONFIG_DIR, "--config-name", CONFIG_NAME, *sys.argv[1:]])
    main()
