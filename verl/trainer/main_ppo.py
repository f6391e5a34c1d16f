"""PPO / GRPO entry point: ``python -m verl.trainer.main_ppo key=value ...``.

Order of events:
1. the command-line overrides are checked against ``config/ppo_trainer.yaml`` (unknown or misspelled keys
   fail with a "did you mean" hint) and the composed config is validated (choices, batch arithmetic, files);
   on a problem ONE message goes to stderr and the process exits with code 2 having written nothing;
2. Ray starts (loopback, no dashboard) unless already initialized or ``RAY_ADDRESS`` points at a cluster;
3. a ``TaskRunner`` actor (``verl/trainer/task_runner.py``) builds the tokenizer, worker classes, role -> resource-pool mapping, reward
   functions and datasets, then runs ``RayPPOTrainer.init_workers()`` and ``.fit()``.

Placement: every role shares ``global_pool`` (``[trainer.n_gpus_per_node] * trainer.nnodes`` processes;
on CPU a "gpu" is a worker process); ``reward_model.enable_resource_pool`` gives the reward model its own
pool; ``run_ppo(config, placement="split")`` puts actor/rollout/ref on one half of the processes and the
critic (and reward model) on the other half (verl's split-placement example).
"""

from __future__ import annotations

import os
import sys
from operator import attrgetter
from typing import Any

import hydra
import ray
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from verl.trainer.config_schema import PPOPlan, validate_ppo_config
from verl.trainer.config_schema.ppo import AlgorithmConfig, DataConfig, PPOTrainerConfig, as_ppo_config
from verl.trainer.config_schema.profiler import PROFILED_ROLES
from verl.trainer.config_schema.spec import build, specs
from verl.trainer.host_defaults import explicit_override_keys, resolve_host_defaults
from verl.utils.config import ConfigError, check_overrides
from verl.utils.import_utils import load_class

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
    """verl's DAPO scripts set these keys; main_ppo's yaml does not carry them, so a plain override of one names the
    recipe to use instead. Added keys (``+data.gen_batch_size=...``, ``+algorithm.filter_groups.enable=False``) are
    judged by value once the config is composed (:func:`refuse_dynamic_sampling`): values that leave dynamic
    sampling off are accepted, as verl's main_ppo accepts them."""
    for override in overrides:
        if override.startswith("+"):
            continue
        key = override.lstrip("~").split("=", 1)[0]
        if key.startswith(_DYNAMIC_SAMPLING_KEYS):
            config_error_exit(ConfigError(
                f"'{override}': {key} belongs to DAPO's dynamic sampling, which runs in the DAPO recipe: python -m "
                "recipe.dapo.main_dapo with the same overrides (main_ppo trains on every generated group)"))


def refuse_dynamic_sampling(config: DictConfig) -> None:
    """DAPO's dynamic sampling keys are accepted here at their defaults (verl's yamls carry them); turning it on
    needs the DAPO recipe's trainer, which generates until enough groups carry a learning signal."""
    # the two sections typed (keys main_ppo's yaml leaves out take the schema's defaults: dynamic sampling off)
    try:
        algorithm, data = build(AlgorithmConfig, config.algorithm), build(DataConfig, config.data)
    except OmegaConfBaseException as e:  # a broken interpolation such as ${trainer.nonexistent}
        config_error_exit(ConfigError(f"config interpolation failed: {e}"))
    if algorithm.filter_groups is not None and algorithm.filter_groups.enable:
        config_error_exit(ConfigError(
            "algorithm.filter_groups.enable=True (DAPO dynamic sampling) runs in the DAPO recipe: "
            "python -m recipe.dapo.main_dapo with the same overrides; main_ppo trains on every generated group"))
    gen_bsz = data.gen_batch_size
    if gen_bsz is not None and gen_bsz != data.train_batch_size:
        config_error_exit(ConfigError(
            f"data.gen_batch_size={gen_bsz} differs from data.train_batch_size={data.train_batch_size}: "
            "drawing more prompts than a step trains on is DAPO's dynamic sampling (python -m "
            "recipe.dapo.main_dapo); remove data.gen_batch_size here"))
    # what is left leaves dynamic sampling off, exactly as without the keys (main_ppo's yaml does not carry them)
    with open_dict(config):
        for parent, leaf in (("data", "gen_batch_size"), ("algorithm", "filter_groups")):
            if leaf in config[parent]:
                del config[parent][leaf]


def run_ppo(config: DictConfig, task_runner_class=None, placement: str = "colocate") -> None:
    """Resolve host-aware defaults, validate ``config``, start Ray if needed and run the trainer in a TaskRunner
    (``task_runner_class``: a TaskRunner subclass, made a Ray actor here, or an actor class already, or its
    ``"module:Class"`` name, imported inside the actor so that this process does not load the trainer)."""
    print(resolve_host_defaults(config, explicit_override_keys()), flush=True)
    plan = validate_or_exit(config)
    absolutize_local_paths(config, plan)
    if not ray.is_initialized():
        init_ray(config, plan)
    args = ()
    if task_runner_class is None or isinstance(task_runner_class, str):
        args = (task_runner_class or DEFAULT_TASK_RUNNER,)
        task_runner_class = NamedTaskRunner
    if not hasattr(task_runner_class, "remote"):
        # the runner only orchestrates: on CPU it must not take a core away from the workers
        task_runner_class = ray.remote(num_cpus=0 if plan.device == "cpu" else 1)(task_runner_class)
    runner = task_runner_class.remote(*args)
    ray.get(runner.run.remote(config, placement))


# keys holding local paths: made absolute on the driver, so Ray processes (other cwd) find the same files
_PATH_KEYS = (
    "data.train_files", "data.val_files", "actor_rollout_ref.model.path", "actor_rollout_ref.model.tokenizer_path",
    "critic.model.path", "critic.model.tokenizer_path", "reward_model.model.path", "reward_model.model.input_tokenizer",
    "custom_reward_function.path", "data.custom_cls.path", "trainer.default_local_dir", "trainer.resume_from_path",
    "trainer.rollout_data_dir", "trainer.validation_data_dir", "global_profiler.save_path",
    *(f"{role}.profiler.save_path" for role in PROFILED_ROLES),
)


def _abs(value):
    if isinstance(value, str) and value and not value.startswith(("hdfs://", "pkg://")):
        return os.path.abspath(os.path.expanduser(value))
    return value


def typed_run_config(config: DictConfig, plan: PPOPlan | None = None) -> PPOTrainerConfig:
    """The run's config, typed: the validator's (``plan.config``), else built from ``config`` as it is now (a
    recipe's driver checks its config its own way and has no plan)."""
    if plan is not None and plan.config is not None:
        return plan.config
    return as_ppo_config(config)


def absolutize_local_paths(config: DictConfig, plan: PPOPlan | None = None) -> None:
    """Resolve interpolations, then make relative local paths absolute (relative to the launch directory), in
    ``config``: the config the Ray processes receive.

    A model name like ``Qwen/Qwen2.5-0.5B`` that is not a local directory stays as it is (HF cache)."""
    OmegaConf.resolve(config)
    typed = typed_run_config(config, plan)
    with open_dict(config):
        for key in _PATH_KEYS:
            value = attrgetter(key)(typed)
            if value is None:
                continue
            if isinstance(value, (list, tuple)):
                new = [_abs(v) for v in value]
            elif key.endswith("model.path") or key.endswith("tokenizer_path") or key.endswith("input_tokenizer"):
                expanded = os.path.expanduser(str(value))
                new = os.path.abspath(expanded) if os.path.exists(expanded) else value
            else:
                new = _abs(value)
            if new != value:
                OmegaConf.update(config, key, new, merge=False)
    for env in ("VERL_FILE_LOGGER_PATH", "VERL_FILE_LOGGER_ROOT", "TENSORBOARD_DIR", "WANDB_DIR"):
        if os.environ.get(env):
            os.environ[env] = os.path.abspath(os.path.expanduser(os.environ[env]))
    os.environ.setdefault("VERL_FILE_LOGGER_ROOT", os.getcwd())


def init_ray(config: DictConfig, plan: PPOPlan | None) -> None:
    """``ray.init(**ray_init_kwargs(...))``. A Ray started here is this process's child and its workers inherit
    this environment, so :func:`worker_env` goes into it for the call (instead of a job runtime_env, which keeps
    Ray from placing actors in the worker processes it pre-starts) and is taken out again once Ray runs: a script
    that calls the trainer keeps its own environment. Joining a cluster (``RAY_ADDRESS``) sends the variables in
    the job's runtime_env instead."""
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    typed = typed_run_config(config, plan)
    kwargs = _ray_init_kwargs(typed)
    if os.environ.get("RAY_ADDRESS"):
        ray.init(**kwargs)
        return
    if typed.ray_init.timeline_json_file:
        os.environ["RAY_PROFILING"] = "1"
    env = worker_env()
    before = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        ray.init(**kwargs)
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def worker_env() -> dict[str, str]:
    """The variables every Ray worker of a run needs: the defaults, plus the caller's values of the variables
    passed through (fault switches, logging)."""
    env = dict(_WORKER_ENV_DEFAULTS)
    env.update({k: os.environ[k] for k in _WORKER_ENV_PASSTHROUGH if k in os.environ})
    return env


def ray_init_kwargs(config: DictConfig, plan: PPOPlan | None) -> dict:
    """The keyword arguments of ``ray.init`` for this run (no side effects; :func:`init_ray` sets the
    environment a local Ray inherits)."""
    return _ray_init_kwargs(typed_run_config(config, plan))


def _ray_init_kwargs(typed: PPOTrainerConfig) -> dict:
    kwargs: dict[str, Any] = {}
    extra = dict(typed.ray_kwargs.ray_init or {})  # free-form ray.init arguments, passed on as given
    num_cpus = typed.ray_init.num_cpus or extra.pop("num_cpus", None)
    if os.environ.get("RAY_ADDRESS"):
        kwargs.update(extra)
        # join the user's cluster as is; its processes get the variables through the job's runtime_env
        runtime_env = dict(kwargs.get("runtime_env") or {})
        joined = worker_env()
        if os.environ.get("PYTHONPATH"):
            # a user's modules (external_lib, reward functions) on the driver's PYTHONPATH: the cluster's workers
            # do not inherit this process's environment, so the path goes first in theirs (Ray expands ${...})
            joined["PYTHONPATH"] = os.environ["PYTHONPATH"] + os.pathsep + "${PYTHONPATH}"
        runtime_env["env_vars"] = {**joined, **dict(runtime_env.get("env_vars") or {})}
        kwargs["runtime_env"] = runtime_env
        return kwargs
    if num_cpus is None:
        # Ray CPUs are logical: make sure every worker process of every pool gets a slot
        num_cpus = max(os.cpu_count() or 1, _total_processes(typed) + 1)
    kwargs.update(
        num_cpus=int(num_cpus),
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
    )
    kwargs.update(extra)
    return kwargs


def _total_processes(typed: PPOTrainerConfig) -> int:
    trainer, reward_model = typed.trainer, typed.reward_model
    total = int(trainer.n_gpus_per_node) * int(trainer.nnodes)
    if reward_model.enable and reward_model.enable_resource_pool:
        total += int(reward_model.n_gpus_per_node) * int(reward_model.nnodes)
    return total


DEFAULT_TASK_RUNNER = "verl.trainer.task_runner:TaskRunner"


class NamedTaskRunner:
    """A TaskRunner named ``"module:Class"``, imported inside its Ray actor: the driver process never loads the
    trainer or the workers."""

    def __init__(self, target: str):
        self.name = target.rpartition(":")[2]
        self.runner = load_class(target)()

    def __repr__(self) -> str:  # Ray prefixes the actor's log lines with it: "(TaskRunner pid=...)"
        return self.name

    def run(self, config: DictConfig, placement: str = "colocate") -> None:
        self.runner.run(config, placement)


def create_rl_dataset(data_paths, data_config, tokenizer, processor, is_train=True, max_samples: int = -1):
    """verl's dataset factory: ``data.custom_cls`` if set, else the RL parquet dataset, over ``data_paths``;
    ``max_samples`` rows at most (-1: all, whatever data.train/val_max_samples say, as in verl)."""
    from verl.utils.dataset.rl_dataset import create_rl_dataset as build  # loads transformers: only when called

    return build(data_paths, data_config, tokenizer, processor, is_train=is_train, max_samples=max_samples)


def create_rl_sampler(data_config, dataset):
    """verl's sampler factory: ``data.sampler.class_path``/``class_name`` (a curriculum sampler), else a resumable
    random order seeded by ``data.seed`` when ``data.shuffle``, else the file order."""
    from verl.utils.dataset.rl_dataset import create_rl_sampler as build  # loads transformers: only when called

    return build(data_config, dataset)


def __getattr__(name: str):
    # ``from verl.trainer.main_ppo import TaskRunner`` (recipes subclass it) keeps working; loading it on first
    # use keeps ``python -m verl.trainer.main_ppo`` light (PEP 562)
    if name == "TaskRunner":
        from verl.trainer.task_runner import TaskRunner

        return TaskRunner
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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


def schema_keys() -> list[str]:
    """Every key the trainer's schema declares, including the optional ones its yaml does not carry (added with
    ``+key=value``, e.g. ``+actor_rollout_ref.rollout.seed=1``)."""
    return list(specs(PPOTrainerConfig))


def free_form_keys() -> list[str]:
    """The schema's free-form mappings (``override_config``, ``override_transformer_config`` ...): new keys under
    them are the user's own, even where the yaml gives the mapping default entries."""
    return [path for path, spec in specs(PPOTrainerConfig).items() if spec.free_form]


def precheck_cli(argv: list[str]) -> None:
    """Check overrides and compose the config before Hydra does: our messages, exit code 2, nothing written."""
    config_dir, config_name, overrides = _split_cli(argv)
    if any(a in ("--help", "-h", "--hydra-help", "--info", "-i", "--cfg", "-c", "--shell-completion", "-sc") or a.startswith("--cfg") for a in argv):
        return
    user_overrides = [o for o in overrides if not o.lstrip("+~").startswith("hydra")]
    checked = user_overrides
    ours = os.path.realpath(config_dir) == os.path.realpath(CONFIG_DIR)  # also --config-path=./config
    if ours:
        refuse_dynamic_sampling_overrides(user_overrides)
        # added DAPO keys are judged by value after composing (refuse_dynamic_sampling), not as typos
        checked = [o for o in user_overrides
                   if not (o.startswith("+") and o.lstrip("+").startswith(_DYNAMIC_SAMPLING_KEYS))]
    try:
        with initialize_config_dir(config_dir=config_dir, version_base=None):
            base = compose(config_name=config_name)
            # a config of the user's own composes on ours: the schema's free-form mappings stay free-form there
            for warning in check_overrides(base, checked, known=schema_keys() if ours else (),
                                           free_form=free_form_keys()):
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


CHECK_FLAG = "--check-config"


def check_config_cli(argv: list[str]) -> None:
    """``python -m verl.trainer.main_ppo --check-config key=value ...``: every check the driver runs before Ray
    starts (the command line, composition, host-aware defaults, the config validator with its file checks), then
    ``config ok`` and exit 0, or the ``Config error:`` line and exit 2. Starts nothing, writes nothing."""
    precheck_cli(argv)
    config_dir, config_name, overrides = _split_cli(argv)
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        config = compose(config_name=config_name, overrides=overrides)
    refuse_dynamic_sampling(config)
    explicit = {o.split("=", 1)[0].lstrip("+~") for o in overrides if not o.lstrip("+~").startswith("hydra")}
    print(resolve_host_defaults(config, explicit), flush=True)
    validate_or_exit(config)
    print("config ok", flush=True)
    sys.exit(0)


if __name__ == "__main__":
    if CHECK_FLAG in sys.argv[1:]:
        check_config_cli([a for a in sys.argv[1:] if a != CHECK_FLAG])
    precheck_cli(sys.argv[1:])
    main()
