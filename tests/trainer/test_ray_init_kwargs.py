"""How main_ppo starts or joins Ray: the variables the workers need reach them either way."""

from __future__ import annotations

import os

import pytest
from hydra import compose, initialize_config_dir

from verl.trainer import main_ppo


@pytest.fixture
def config():
    with initialize_config_dir(config_dir=main_ppo.CONFIG_DIR, version_base=None):
        return compose(config_name="ppo_trainer", overrides=["trainer.n_gpus_per_node=2"])


def test_local_ray_inherits_the_variables_so_prestarted_workers_can_host_the_actors(config, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("VERL_DEBUG_SKIP_WEIGHT_SYNC", "1")
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
    for name in main_ppo._WORKER_ENV_DEFAULTS:
        monkeypatch.delenv(name, raising=False)
    before = dict(os.environ)
    kwargs = main_ppo.ray_init_kwargs(config, None)
    assert dict(os.environ) == before  # building the arguments changes nothing; init_ray sets the environment
    # a job runtime_env would keep Ray from placing actors in its pre-started worker processes
    assert "runtime_env" not in kwargs
    assert kwargs["num_cpus"] >= 3 and kwargs["include_dashboard"] is False
    env = main_ppo.worker_env()  # what a Ray this process starts, and so every worker, inherits
    for name, value in main_ppo._WORKER_ENV_DEFAULTS.items():
        assert env[name] == value
    assert env["VERL_DEBUG_SKIP_WEIGHT_SYNC"] == "1"


def test_joining_a_cluster_sends_the_variables_in_the_runtime_env(config, monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6379")
    monkeypatch.setenv("VERL_DEBUG_SKIP_WEIGHT_SYNC", "1")
    config.ray_kwargs = {"ray_init": {"runtime_env": {"env_vars": {"MY_FLAG": "x", "NCCL_DEBUG": "INFO"}}}}
    kwargs = main_ppo.ray_init_kwargs(config, None)
    env = kwargs["runtime_env"]["env_vars"]
    assert env["VERL_DEBUG_SKIP_WEIGHT_SYNC"] == "1" and env["MY_FLAG"] == "x"
    assert env["NCCL_DEBUG"] == "INFO"  # the user's own value wins over the default
    assert env["VLLM_LOGGING_LEVEL"] == main_ppo._WORKER_ENV_DEFAULTS["VLLM_LOGGING_LEVEL"]
    assert "num_cpus" not in kwargs  # a running cluster keeps its own resources
    monkeypatch.setenv("PYTHONPATH", "/my/modules")  # the user's modules go first on the workers' path
    env = main_ppo.ray_init_kwargs(config, None)["runtime_env"]["env_vars"]
    assert env["PYTHONPATH"] == "/my/modules" + os.pathsep + "${PYTHONPATH}"


def test_workers_of_a_local_ray_see_the_variables_and_the_caller_keeps_its_environment(config, monkeypatch):
    import ray

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.delenv("VLLM_LOGGING_LEVEL", raising=False)
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
    config.ray_init.num_cpus = 1
    main_ppo.init_ray(config, None)
    try:
        @ray.remote(num_cpus=0)
        def worker_env():
            return {k: os.environ.get(k) for k in ("VLLM_LOGGING_LEVEL", "TOKENIZERS_PARALLELISM")}

        assert ray.get(worker_env.remote()) == {"VLLM_LOGGING_LEVEL": "WARN", "TOKENIZERS_PARALLELISM": "true"}
    finally:
        ray.shutdown()
    assert "VLLM_LOGGING_LEVEL" not in os.environ and os.environ["TOKENIZERS_PARALLELISM"] == "false"
