"""PPO / GRPO entry point: ``python -m verl.trainer.main_ppo key=value ...``.

Order of events:
1. the command-line overrides are checked against ``config/ppo_trainer.yaml`` (unknown or misspelled keys
   fail with a "did you mean" hint) and the composed config is validated (choices, batch arithmetic, files);
   on a problem ONE message goes to stderr and the process exits with code 2 having written nothing;
2. Ray starts (loopback, no dashboard) unless already initialized or ``RAY_ADDRESS`` points at a cluster;
3. a ``TaskRunner`` actor builds the tokenizer, worker classes, role -> resource-pool mapping, reward
   functions and datasets, then runs ``RayPPOTrainer.init_workers()`` and ``.fit()``.

Placement: every role shares ``global_pool`` (``[trainer.n_gpus_per_node] * trainer.nnodes`` processes;
on CPU a "gpu" is a worker process); ``reward_model.enable_resource_pool`` gives the reward model its own
pool; ``run_ppo(config, placement="split")`` puts actor/rollout/ref on one half of the processes and the
critic (and reward model) on the other half (verl's split-placement example).
"""

from __future__ import annotations

import os
import socket
import sys
from pprint import pprint
from typing import Any

import hydra
import ray
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict

from verl.single_controller.ray import RayWorkerGroup
from verl.trainer.config_schema import PPOPlan, validate_ppo_config
from verl.trainer.host_defaults import explicit_override_keys, resolve_host_defaults
from verl.trainer.ppo.ray_trainer import RayPPOTrainer, ResourcePoolManager, Role
from verl.trainer.ppo.reward import load_reward_manager
from verl.utils.config import ConfigError, check_overrides
from verl.utils.dataset.rl_dataset import collate_fn, create_rl_dataset, create_rl_sampler
from verl.utils.fs import copy_to_local
from verl.utils.import_utils import import_external_libs
from verl.utils.tokenizer import hf_processor, hf_tokenizer
from verl.workers import fsdp_workers, megatron_workers

CONFIG_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "config")
EXIT_CONFIG_ERROR = 2

# environment passed to every Ray worker (values of the driver win when set there)
_WORKER_ENV_DEFAULTS = {
    "TOKENIZERS_PARALLELISM": "true",
    "NCCL_DEBUG": "WARN",
    "VLLM_LOGGING_LEVEL": "WARN",
    "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "true",
}
_WORKER_ENV_PASSTHROUGH = (
    "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HOME", "HF_DATASETS_OFFLINE", "WANDB_MODE", "WANDB_DIR",
    "VERL_DEVICE", "VERL_FILE_LOGGER_PATH", "TENSORBOARD_DIR", "OMP_NUM_THREADS", "PYTHONHASHSEED",
    "VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_NUM_OF_RESERVED_CPU", "VLLM_ENABLE_V1_MULTIPROCESSING",
    "CUBLAS_WORKSPACE_CONFIG", "RAY_AUTH_MODE", "VERL_FILE_LOGGER_ROOT", "WANDB_SILENT",
    "VERL_DEBUG_SKIP_WEIGHT_SYNC",  # fault switch for the probs-diff test (docs/hybrid_engine.md)
    "VERL_PRINT_CONFIG", "MLFLOW_TRACKING_URI", "SWANLAB_MODE", "SWANLAB_LOG_DIR",
)


def config_error_exit(err: BaseException) -> None:
    print(f"Config error: {err}", file=sys.stderr, flush=True)
    sys.exit(EXIT_CONFIG_ERROR)


def validate_or_exit(config: DictConfig) -> PPOPlan:
    try:
        return validate_ppo_config(config)
    except ConfigError as e:
        config_error_exit(e)


@hydra.main(config_path="config", config_name="ppo_trainer", version_base=None)
def main(config: DictConfig) -> None:
    refuse_dynamic_sampling(config)
    run_ppo(config)


_DYNAMIC_SAMPLING_KEYS = ("algorithm.filter_groups.", "data.gen_batch_size")


def refuse_dynamic_sampling_overrides(overrides: list[str]) -> None:
    """verl's DAPO scripts set these keys; on main_ppo's command line they name the recipe to use instead."""
    for override in overrides:
        key = override.lstrip("+~").split("=", 1)[0]
        if key.startswith(_DYNAMIC_SAMPLING_KEYS):
            config_error_exit(ConfigError(
                f"'{override}': {key} belongs to DAPO's dynamic sampling, which runs in the DAPO recipe: python -m "
                "recipe.dapo.main_dapo with the same overrides (main_ppo trains on every generated group)"))


def refuse_dynamic_sampling(config: DictConfig) -> None:
    """DAPO's dynamic sampling keys are accepted here at their defaults (verl's yamls carry them); turning it on
    needs the DAPO recipe's trainer, which generates until enough groups carry a learning signal."""
    if OmegaConf.select(config, "algorithm.filter_groups.enable", default=False):
        config_error_exit(ConfigError(
            "algorithm.filter_groups.enable=True (DAPO dynamic sampling) runs in the DAPO recipe: "
            "python -m recipe.dapo.main_dapo with the same overrides; main_ppo trains on every generated group"))
    gen_bsz = OmegaConf.select(config, "data.gen_batch_size", default=None)
    if gen_bsz is not None and gen_bsz != config.data.train_batch_size:
        config_error_exit(ConfigError(
            f"data.gen_batch_size={gen_bsz} differs from data.train_batch_size={config.data.train_batch_size}: "
            "drawing more prompts than a step trains on is DAPO's dynamic sampling (python -m "
            "recipe.dapo.main_dapo); remove data.gen_batch_size here"))


def run_ppo(config: DictConfig, task_runner_class=None, placement: str = "colocate") -> None:
    """Resolve host-aware defaults, validate ``config``, start Ray if needed and run the trainer in a TaskRunner
    (``task_runner_class``: a TaskRunner subclass, made a Ray actor here, or an actor class already)."""
    print(resolve_host_defaults(config, explicit_override_keys()), flush=True)
    plan = validate_or_exit(config)
    absolutize_local_paths(config)
    if not ray.is_initialized():
        ray.init(**ray_init_kwargs(config, plan))
    if task_runner_class is None or not hasattr(task_runner_class, "remote"):
        # the runner only orchestrates: on CPU it must not take a core away from the workers
        task_runner_class = ray.remote(num_cpus=0 if plan.device == "cpu" else 1)(task_runner_class or TaskRunner)
    runner = task_runner_class.remote()
    ray.get(runner.run.remote(config, placement))


# keys holding local paths: made absolute on the driver, so Ray processes (other cwd) find the same files
_PATH_KEYS = (
    "data.train_files", "data.val_files", "actor_rollout_ref.model.path", "actor_rollout_ref.model.tokenizer_path",
    "critic.model.path", "critic.model.tokenizer_path", "reward_model.model.path", "reward_model.model.input_tokenizer",
    "custom_reward_function.path", "data.custom_cls.path", "trainer.default_local_dir", "trainer.resume_from_path",
    "trainer.rollout_data_dir", "trainer.validation_data_dir",
)


def _abs(value):
    if isinstance(value, str) and value and not value.startswith(("hdfs://", "pkg://")):
        return os.path.abspath(os.path.expanduser(value))
    return value


def absolutize_local_paths(config: DictConfig) -> None:
    """Resolve interpolations, then make relative local paths absolute (relative to the launch directory).

    A model name like ``Qwen/Qwen2.5-0.5B`` that is not a local directory stays as it is (HF cache)."""
    OmegaConf.resolve(config)
    with open_dict(config):
        for key in _PATH_KEYS:
            value = OmegaConf.select(config, key, default=None)
            if value is None:
                continue
            parent, _, leaf = key.rpartition(".")
            node = OmegaConf.select(config, parent)
            if isinstance(value, (list, ListConfig)):
                node[leaf] = [_abs(v) for v in value]
            elif key.endswith("model.path") or key.endswith("tokenizer_path") or key.endswith("input_tokenizer"):
                expanded = os.path.expanduser(str(value))
                node[leaf] = os.path.abspath(expanded) if os.path.exists(expanded) else value
            else:
                node[leaf] = _abs(value)
    for env in ("VERL_FILE_LOGGER_PATH", "VERL_FILE_LOGGER_ROOT", "TENSORBOARD_DIR", "WANDB_DIR"):
        if os.environ.get(env):
            os.environ[env] = os.path.abspath(os.path.expanduser(os.environ[env]))
    os.environ.setdefault("VERL_FILE_LOGGER_ROOT", os.getcwd())


def ray_init_kwargs(config: DictConfig, plan: PPOPlan) -> dict:
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    env = dict(_WORKER_ENV_DEFAULTS)
    env.update({k: os.environ[k] for k in _WORKER_ENV_PASSTHROUGH if k in os.environ})
    kwargs: dict[str, Any] = {"runtime_env": {"env_vars": env}}
    extra_node = OmegaConf.select(config, "ray_kwargs.ray_init", default=None)
    extra = dict(OmegaConf.to_container(extra_node, resolve=True)) if extra_node else {}
    num_cpus = OmegaConf.select(config, "ray_init.num_cpus", default=None) or extra.pop("num_cpus", None)
    if os.environ.get("RAY_ADDRESS"):
        kwargs.update(extra)
        return kwargs  # join the user's cluster as is
    if num_cpus is None:
        # Ray CPUs are logical: make sure every worker process of every pool gets a slot
        num_cpus = max(os.cpu_count() or 1, _total_processes(config) + 1)
    kwargs.update(
        num_cpus=int(num_cpus),
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
    )
    timeline = OmegaConf.select(config, "ray_init.timeline_json_file", default=None)
    if timeline:
        os.environ["RAY_PROFILING"] = "1"
    for key, value in extra.items():
        if key == "runtime_env":
            value = dict(value)
            value.setdefault("env_vars", {}).update(env)
        kwargs[key] = value
    return kwargs


def _total_processes(config: DictConfig) -> int:
    total = int(config.trainer.n_gpus_per_node) * int(config.trainer.nnodes)
    if config.reward_model.enable and config.reward_model.enable_resource_pool:
        total += int(config.reward_model.n_gpus_per_node) * int(config.reward_model.nnodes)
    return total


# ------------------------------------------------------------------------------------------------ task runner

def resource_pools(config: DictConfig, plan: PPOPlan, placement: str = "colocate") -> tuple[dict, dict]:
    """Role -> pool mapping and pool sizes: ``({pool: [procs per node] * nnodes}, {Role: pool})``."""
    nnodes, per_node = int(config.trainer.nnodes), int(config.trainer.n_gpus_per_node)
    actor_role = Role.ActorRollout
    if placement == "colocate":
        spec = {"global_pool": [per_node] * nnodes}
        actor_pool = critic_pool = "global_pool"
    elif placement == "split":
        if per_node >= 2:
            half = [per_node // 2] * nnodes
            spec = {"actor_rollout_ref_pool": half, "critic_pool": half}
        elif nnodes >= 2:
            spec = {"actor_rollout_ref_pool": [per_node] * (nnodes // 2), "critic_pool": [per_node] * (nnodes // 2)}
        else:
            raise ConfigError("split placement needs trainer.n_gpus_per_node >= 2 or trainer.nnodes >= 2")
        actor_pool, critic_pool = "actor_rollout_ref_pool", "critic_pool"
    else:
        raise ConfigError(f"placement={placement!r} is not one of: colocate, split")
    mapping = {actor_role: actor_pool}
    if plan.use_critic:
        mapping[Role.Critic] = critic_pool
    if plan.use_reference_policy and not plan.ref_in_actor:
        mapping[Role.RefPolicy] = actor_pool
    if plan.use_rm:
        if config.reward_model.enable_resource_pool:
            spec["reward_pool"] = [int(config.reward_model.n_gpus_per_node)] * int(config.reward_model.nnodes)
            mapping[Role.RewardModel] = "reward_pool"
        else:
            mapping[Role.RewardModel] = critic_pool
    return spec, mapping


def worker_classes(config: DictConfig):
    """(ActorRolloutRefWorker, CriticWorker, RewardModelWorker, worker-group class) for the strategy."""
    strategy = config.actor_rollout_ref.actor.strategy
    if strategy in ("fsdp", "fsdp2"):
        workers = fsdp_workers
    elif strategy == "megatron":
        workers = megatron_workers
    else:
        raise ConfigError(f"actor_rollout_ref.actor.strategy={strategy!r} is not one of: fsdp, fsdp2, megatron")
    return workers.ActorRolloutRefWorker, workers.CriticWorker, workers.RewardModelWorker, RayWorkerGroup


class TaskRunner:
    """Builds everything the trainer needs inside one Ray actor, then trains. A recipe's runner subclass sets
    ``trainer_cls`` to its RayPPOTrainer subclass (recipe/dapo)."""

    trainer_cls = None  # None: RayPPOTrainer

    def run(self, config: DictConfig, placement: str = "colocate") -> None:
        print(f"TaskRunner on {socket.gethostname()}, pid {os.getpid()}")
        OmegaConf.resolve(config)
        plan = validate_ppo_config(config)
        print_config(config)

        import_external_libs(config.actor_rollout_ref.model.get("external_lib", None))
        tokenizer, processor = load_tokenizer_and_processor(config)

        actor_cls, critic_cls, rm_cls, wg_cls = worker_classes(config)
        role_worker_mapping = {Role.ActorRollout: ray.remote(actor_cls)}
        if plan.use_critic:
            role_worker_mapping[Role.Critic] = ray.remote(critic_cls)
        if plan.use_reference_policy and not plan.ref_in_actor:
            role_worker_mapping[Role.RefPolicy] = ray.remote(actor_cls)
        if plan.use_rm:
            role_worker_mapping[Role.RewardModel] = ray.remote(rm_cls)
        spec, mapping = resource_pools(config, plan, placement)
        print(f"Resource pools: {spec}; roles: { {role.name: pool for role, pool in mapping.items()} }")
        resource_pool_manager = ResourcePoolManager(resource_pool_spec=spec, mapping=mapping)

        reward_kwargs_node = OmegaConf.select(config, "reward_model.reward_kwargs", default=None)
        reward_kwargs = dict(OmegaConf.to_container(reward_kwargs_node, resolve=True)) if reward_kwargs_node else {}
        reward_fn = load_reward_manager(config, tokenizer, num_examine=0, **reward_kwargs)
        val_reward_fn = load_reward_manager(config, tokenizer, num_examine=1, **reward_kwargs)

        train_dataset = create_rl_dataset(config.data.train_files, config.data, tokenizer, processor, is_train=True)
        val_dataset = create_rl_dataset(config.data.val_files, config.data, tokenizer, processor, is_train=False)
        train_sampler = create_rl_sampler(config.data, train_dataset)

        trainer = (self.trainer_cls or RayPPOTrainer)(
            config=config,
            tokenizer=tokenizer,
            processor=processor,
            role_worker_mapping=role_worker_mapping,
            resource_pool_manager=resource_pool_manager,
            ray_worker_group_cls=wg_cls,
            reward_fn=reward_fn,
            val_reward_fn=val_reward_fn,
            train_dataset=train_dataset,
            val_dataset=val_dataset,
            collate_fn=collate_fn,
            train_sampler=train_sampler,
            device_name=plan.device,
        )
        trainer.init_workers()
        trainer.fit()


def print_config(config: DictConfig) -> None:
    """One summary line of the run's config; the whole resolved config (~400 lines) with ``VERL_PRINT_CONFIG=1``.

    ``python -m verl.trainer.main_ppo <overrides> --cfg job`` prints the composed config without running."""
    if os.environ.get("VERL_PRINT_CONFIG", "").lower() in ("1", "true", "yes"):
        pprint(OmegaConf.to_container(config, resolve=True))
        return
    rollout, trainer = config.actor_rollout_ref.rollout, config.trainer
    loggers = trainer.logger if isinstance(trainer.logger, str) else list(trainer.logger)
    print(f"Config: algorithm.adv_estimator={config.algorithm.adv_estimator} "
          f"actor_rollout_ref.model.path={config.actor_rollout_ref.model.path} rollout.name={rollout.name} "
          f"rollout.n={rollout.n} data.train_batch_size={config.data.train_batch_size} "
          f"trainer.total_training_steps={trainer.total_training_steps} trainer.logger={loggers} "
          "(set VERL_PRINT_CONFIG=1 to print the full config)", flush=True)


def load_tokenizer_and_processor(config: DictConfig):
    model_cfg = config.actor_rollout_ref.model
    path = copy_to_local(model_cfg.get("tokenizer_path") or model_cfg.path, use_shm=model_cfg.get("use_shm", False))
    trust = bool(config.data.get("trust_remote_code", False) or model_cfg.get("trust_remote_code", False))
    tokenizer = hf_tokenizer(path, trust_remote_code=trust)
    processor = hf_processor(path, trust_remote_code=trust, use_fast=True)
    return tokenizer, processor


# ------------------------------------------------------------------------------------------------ CLI

def _split_cli(argv: list[str]) -> tuple[str, str, list[str]]:
    """(config_dir, config_name, plain overrides) from a Hydra command line; flags are left to Hydra."""
    config_dir, config_name, overrides = CONFIG_DIR, "ppo_trainer", []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg.startswith("-"):
            name, _, value = arg.partition("=")
            takes_value = name in ("--config-name", "-cn", "--config-path", "-cp", "--config-dir", "-cd")
            if takes_value and not value and i + 1 < len(argv):
                value = argv[i + 1]
                i += 1
            if name in ("--config-name", "-cn"):
                config_name = value
            elif name in ("--config-path", "-cp"):
                config_dir = value if os.path.isabs(value) else os.path.join(os.path.dirname(os.path.abspath(__file__)), value)
            i += 1
            continue
        overrides.append(arg)
        i += 1
    return config_dir, config_name, overrides


def precheck_cli(argv: list[str]) -> None:
    """Check overrides and compose the config before Hydra does: our messages, exit code 2, nothing written."""
    config_dir, config_name, overrides = _split_cli(argv)
    if any(a in ("--help", "-h", "--hydra-help", "--info", "-i", "--cfg", "-c", "--shell-completion", "-sc") or a.startswith("--cfg") for a in argv):
        return
    user_overrides = [o for o in overrides if not o.lstrip("+~").startswith("hydra")]
    if config_dir == CONFIG_DIR:
        refuse_dynamic_sampling_overrides(user_overrides)
    try:
        with initialize_config_dir(config_dir=config_dir, version_base=None):
            base = compose(config_name=config_name)
            for warning in check_overrides(base, user_overrides):
                print(warning, file=sys.stderr)
            try:
                compose(config_name=config_name, overrides=user_overrides)
            except Exception as e:  # type errors etc. as Hydra words them, minus the traceback
                raise ConfigError(_one_line_hydra_error(e)) from None
    except ConfigError as e:
        config_error_exit(e)


def _one_line_hydra_error(e: BaseException) -> str:
    text = str(e).strip()
    cause = e.__cause__
    if cause is not None and str(cause).strip() and str(cause).strip() not in text:
        text += ": " + str(cause).strip()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith(("full_key", "object_type", "reference_type"))]
    return " ".join(lines)


if __name__ == "__main__":
    precheck_cli(sys.argv[1:])
    main()
