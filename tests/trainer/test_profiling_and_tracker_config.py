"""Profiling and tracker choices checked before Ray starts: tools this machine cannot run and trackers whose package
is missing are refused by key with what to do instead; profiling that would record nothing is warned about."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from tests.trainer.validator_assets import write_validator_assets
from verl.trainer.config_schema import validate_ppo_config
from verl.utils.config import ConfigError
from verl.utils.tracking import missing_backend_package

REPO = Path(__file__).resolve().parents[2]
CONFIG_DIR = str(REPO / "verl" / "trainer" / "config")


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    root = tmp_path_factory.mktemp("profiler_assets")
    write_validator_assets(root)
    return root


def base_args(assets):
    return [f"data.train_files={assets / 'train.parquet'}", f"data.val_files={assets / 'train.parquet'}",
            f"actor_rollout_ref.model.path={assets / 'model'}", "actor_rollout_ref.rollout.name=hf",
            "algorithm.adv_estimator=grpo", "data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2", "trainer.n_gpus_per_node=2",
            "trainer.logger=console", "trainer.device=cpu"]


def validate(assets, *extra):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        cfg = compose(config_name="ppo_trainer", overrides=base_args(assets) + list(extra))
    return validate_ppo_config(cfg)


@pytest.mark.parametrize("override, message", [
    ("global_profiler.tool=nsys", "global_profiler.tool=nsys (Nsight Systems) needs a CUDA GPU (this run's device is "
                                  "cpu); use global_profiler.tool=torch"),
    ("global_profiler.tool=npu", "global_profiler.tool=npu needs an Ascend NPU (this run's device is cpu); use "
                                 "global_profiler.tool=torch"),
    ("global_profiler.tool=torch_memory", "global_profiler.tool=torch_memory records the CUDA memory allocator and "
                                          "needs a CUDA GPU (this run's device is cpu)"),
    # a role's own tool is checked under its own name
    ("critic.profiler.tool=torch_memory", "critic.profiler.tool=torch_memory records the CUDA memory allocator"),
    ("actor_rollout_ref.actor.profiler.tool=nsys", "actor_rollout_ref.actor.profiler.tool=nsys (Nsight Systems) needs"),
    ("global_profiler.steps=[0,2]", "global_profiler.steps=[0, 2] must be a list of training steps (integers >= 1)"),
    ("global_profiler.tool=perf", "global_profiler.tool='perf' is not one of: None, nsys, npu, torch, torch_memory"),
    # verl's mini-batch range of the torch profiler is not available: refused unless default
    ("actor_rollout_ref.actor.profiler.tool_config.torch.step_start=2",
     "actor_rollout_ref.actor.profiler.tool_config.torch.step_start=2 is not supported: a torch trace covers whole "
     "worker calls"),
])
def test_tools_this_machine_cannot_run_are_refused_by_key(assets, override, message):
    with pytest.raises(ConfigError) as err:
        validate(assets, override)
    assert message in str(err.value)


def test_torch_profiling_passes_and_empty_profiling_is_warned_about(assets, capsys):
    validate(assets, "global_profiler.tool=torch", "global_profiler.steps=[1,3]",
             "actor_rollout_ref.actor.profiler.enable=True")
    assert "nothing is profiled" not in capsys.readouterr().out
    validate(assets, "global_profiler.tool=torch", "global_profiler.steps=[1]")
    assert "no role has profiler.enable=True: nothing is profiled; set actor_rollout_ref.actor.profiler.enable=True" \
        in capsys.readouterr().out
    validate(assets, "global_profiler.tool=torch", "actor_rollout_ref.actor.profiler.enable=True")
    assert "global_profiler.steps is empty: nothing is profiled" in capsys.readouterr().out
    validate(assets, "global_profiler.steps=[2]")
    assert "global_profiler.tool is null: nothing is profiled" in capsys.readouterr().out


@pytest.mark.parametrize("backend", ["clearml", "trackio"])
def test_a_tracker_without_its_package_is_refused(assets, backend):
    if missing_backend_package(backend) is None:
        pytest.skip(f"{backend} is installed here")
    with pytest.raises(ConfigError, match=f"trainer.logger={backend} needs the {backend} package, which is not "
                                          f"installed: pip install {backend}"):
        validate(assets, f"trainer.logger=[console,{backend}]")


def test_refused_before_ray_starts(assets, tmp_path):
    """The real entry point: exit code 2, the key in the message, no Ray started and nothing written."""
    run = tmp_path / "run"
    run.mkdir()
    env = dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1", RAY_AUTH_MODE="disabled")
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.run([sys.executable, "-m", "verl.trainer.main_ppo", *base_args(assets),
                           "global_profiler.tool=torch_memory", "global_profiler.steps=[1]"],
                          cwd=run, env=env, capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out[-3000:]
    assert "Config error: global_profiler.tool=torch_memory records the CUDA memory allocator and needs a CUDA GPU" \
        in out
    assert "Started a local Ray instance" not in out and list(run.iterdir()) == []


def test_sft_refuses_a_tracker_without_its_package(assets):
    from verl.trainer.sft.config import validate_sft_config

    backend = next((b for b in ("clearml", "trackio") if missing_backend_package(b)), None)
    if backend is None:
        pytest.skip("clearml and trackio are both installed here")
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        cfg = compose(config_name="sft_trainer", overrides=[f"data.train_files={assets / 'train.parquet'}",
                                                            f"trainer.logger=[console,{backend}]"])
    with pytest.raises(ConfigError, match=f"trainer.logger={backend} needs the {backend} package"):
        validate_sft_config(cfg, 1, "cpu")
