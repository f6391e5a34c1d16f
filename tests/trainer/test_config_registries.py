"""Open registries: the config's engine (``*.strategy``) and rollout (``rollout.name``) choices are the registered
names, a user's module named by ``actor_rollout_ref.model.external_lib`` (or a ``verl.plugins`` entry point) is
imported before the check, and a custom engine runs in the worker classes its registration names."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from tests.trainer.validator_assets import write_validator_assets
from verl.trainer.config_schema import validate_ppo_config
from verl.trainer.ppo import core_algos
from verl.utils.config import ConfigError
from verl.workers import engine as engine_pkg
from verl.workers import rollout as rollout_pkg
from verl.workers.engine import registry as engine_registry

REPO = Path(__file__).resolve().parents[2]
CONFIG_DIR = str(REPO / "verl" / "trainer" / "config")
AR = "actor_rollout_ref"

USER_MODULE = textwrap.dedent('''
    from verl.trainer.ppo.core_algos import register_adv_est
    from verl.workers.engine import register_engine
    from verl.workers.rollout import HFRollout, register_rollout


    class UnitEngine:
        pass


    class UnitRollout(HFRollout):
        pass


    register_engine("unit_strategy", UnitEngine)
    register_engine("unit_megatron_layout", UnitEngine, workers="megatron")
    register_rollout("unit_rollout", UnitRollout)


    @register_adv_est("unit_adv")
    def unit_adv(**kwargs):
        raise NotImplementedError
''')


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    root = tmp_path_factory.mktemp("registry_assets")
    write_validator_assets(root)
    (root / "lib").mkdir()
    (root / "lib" / "unit_registry_user.py").write_text(USER_MODULE)
    (root / "lib" / "unit_registry_broken.py").write_text("raise RuntimeError('boom at import')\n")
    return root


@pytest.fixture
def user_lib(assets, monkeypatch):
    """``assets/lib`` on sys.path; every registration the user module makes is undone afterwards."""
    monkeypatch.syspath_prepend(str(assets / "lib"))
    engines, workers = dict(engine_registry.ENGINES), dict(engine_registry.WORKERS)
    rollouts, estimators = dict(rollout_pkg.ROLLOUT_REGISTRY), dict(core_algos.ADV_ESTIMATOR_REGISTRY)
    yield "unit_registry_user"
    for module in ("unit_registry_user", "unit_registry_broken"):
        sys.modules.pop(module, None)
    for live, saved in ((engine_registry.ENGINES, engines), (engine_registry.WORKERS, workers),
                        (rollout_pkg.ROLLOUT_REGISTRY, rollouts), (core_algos.ADV_ESTIMATOR_REGISTRY, estimators)):
        live.clear()
        live.update(saved)


def overrides(assets, *extra):
    return [
        f"data.train_files={assets / 'train.parquet'}", f"data.val_files={assets / 'train.parquet'}",
        f"{AR}.model.path={assets / 'model'}", "algorithm.adv_estimator=grpo", f"{AR}.rollout.n=2",
        f"{AR}.rollout.name=hf", f"{AR}.rollout.tensor_model_parallel_size=1", "data.train_batch_size=8",
        f"{AR}.actor.ppo_mini_batch_size=4", f"{AR}.actor.ppo_micro_batch_size_per_gpu=2",
        f"{AR}.rollout.log_prob_micro_batch_size_per_gpu=2", "trainer.n_gpus_per_node=2", "trainer.logger=console",
        *extra]


def validate(assets, *extra):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        cfg = compose(config_name="ppo_trainer", overrides=overrides(assets, *extra))
    return validate_ppo_config(cfg)


def test_names_registered_by_external_lib_are_valid_config(assets, user_lib):
    plan = validate(assets, f"{AR}.model.external_lib={user_lib}", f"{AR}.actor.strategy=unit_strategy",
                    f"{AR}.rollout.name=unit_rollout", "algorithm.adv_estimator=unit_adv")
    assert (plan.strategy, plan.rollout_name, plan.algorithm.adv_estimator) == ("unit_strategy", "unit_rollout",
                                                                                  "unit_adv")
    assert plan.config.actor_rollout_ref.ref.strategy == "unit_strategy"  # the reference follows the actor
    assert engine_pkg.get_engine_cls("unit_strategy").__name__ == "UnitEngine"
    assert rollout_pkg.get_rollout_class("unit_rollout").__name__ == "UnitRollout"


def test_without_the_registration_the_same_names_are_refused_listing_the_registered_ones(assets):
    with pytest.raises(ConfigError) as info:
        validate(assets, f"{AR}.actor.strategy=unit_strategy")
    assert str(info.value) == (f"{AR}.actor.strategy='unit_strategy' is not one of: fsdp, fsdp2, megatron")
    with pytest.raises(ConfigError) as info:
        validate(assets, f"{AR}.rollout.name=unit_rollout")
    assert str(info.value) == f"{AR}.rollout.name='unit_rollout' is not one of: hf, vllm, sglang"


def test_unknown_names_list_the_user_registrations_too(assets, user_lib):
    lib = f"{AR}.model.external_lib={user_lib}"
    with pytest.raises(ConfigError) as info:
        validate(assets, lib, f"{AR}.actor.strategy=unit_stratgy")
    msg = str(info.value)
    assert msg.startswith(f"{AR}.actor.strategy='unit_stratgy' is not one of: fsdp, fsdp2, megatron, unit_strategy")
    assert "did you mean 'unit_strategy'" in msg
    with pytest.raises(ConfigError, match=f"{AR}.rollout.name='my_rolout' is not one of: hf, vllm, sglang, "
                                          "unit_rollout"):
        validate(assets, lib, f"{AR}.rollout.name=my_rolout")
    with pytest.raises(ConfigError, match="critic.strategy='fdsp' is not one of: fsdp, fsdp2, megatron, unit_strategy"):
        validate(assets, lib, "critic.strategy=fdsp")


def test_verl_names_keep_working_and_sglang_is_still_refused_on_cpu(assets):
    assert validate(assets, f"{AR}.actor.strategy=fsdp2").strategy == "fsdp2"
    with pytest.raises(ConfigError, match="sglang needs CUDA"):
        validate(assets, f"{AR}.rollout.name=sglang")


def test_external_lib_that_cannot_be_imported_is_a_config_error_naming_the_key(assets, user_lib):
    with pytest.raises(ConfigError) as info:
        validate(assets, f"{AR}.model.external_lib=no_such_registry_module")
    msg = str(info.value)
    assert msg.startswith(f"{AR}.model.external_lib='no_such_registry_module': no module named "
                          "'no_such_registry_module'")
    assert "PYTHONPATH" in msg
    with pytest.raises(ConfigError, match=f"{AR}.model.external_lib='unit_registry_broken': importing it raised "
                                          "RuntimeError: boom at import"):
        validate(assets, f"{AR}.model.external_lib=unit_registry_broken")


def test_custom_engine_runs_in_the_worker_classes_its_registration_names(user_lib):
    from omegaconf import OmegaConf

    from verl.trainer.config_schema.ppo import PPOTrainerConfig
    from verl.trainer.config_schema.spec import build
    from verl.trainer.task_runner import worker_classes
    from verl.workers import fsdp_workers, megatron_workers

    __import__(user_lib)

    def actor_cls(strategy):
        config = OmegaConf.create({"trainer": {}, AR: {"actor": {"strategy": strategy}}})
        return worker_classes(build(PPOTrainerConfig, config))[0]

    assert actor_cls("unit_strategy") is fsdp_workers.ActorRolloutRefWorker  # the default: FSDP-style workers
    assert actor_cls("unit_megatron_layout") is megatron_workers.ActorRolloutRefWorker
    assert actor_cls("fsdp") is fsdp_workers.ActorRolloutRefWorker
    assert actor_cls("megatron") is megatron_workers.ActorRolloutRefWorker
    with pytest.raises(ConfigError, match="strategy='nope' has no training engine here; choose one of: fsdp"):
        actor_cls("nope")


def test_register_engine_and_rollout_refuse_bad_arguments():
    with pytest.raises(ValueError, match="workers must be one of fsdp, megatron"):
        engine_pkg.register_engine("x_strategy", object, workers="tpu")
    with pytest.raises(ValueError, match="non-empty str"):
        engine_pkg.register_engine("", object)
    with pytest.raises(ValueError, match="lower-case"):
        rollout_pkg.register_rollout("MyRollout", object)
    assert "x_strategy" not in engine_pkg.engine_names()
    with pytest.raises(ValueError, match="register_rollout"):
        rollout_pkg.get_rollout_class("nope")


def test_verl_plugins_entry_point_registers_without_external_lib(tmp_path):
    """An installed package's ``verl.plugins`` entry point is imported before the config check (a stand-in
    distribution: a ``.dist-info`` directory on the path)."""
    (tmp_path / "ep_registry_user.py").write_text(
        "from verl.workers.rollout import HFRollout, register_rollout\n"
        "class EpRollout(HFRollout):\n    pass\n"
        "register_rollout('ep_rollout', EpRollout)\n")
    info = tmp_path / "ep_registry_user-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: ep-registry-user\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[verl.plugins]\nunit = ep_registry_user\n")
    code = ("from verl.trainer.config_schema.validate import import_registrations\n"
            "from omegaconf import OmegaConf\n"
            "import_registrations(OmegaConf.create({}))\n"
            "from verl.utils.import_utils import load_plugins\n"
            "from verl.workers.rollout import rollout_names\n"
            "print(load_plugins(), rollout_names())\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120,
                          env={**__import__("os").environ, "PYTHONPATH": f"{tmp_path}:{REPO}"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "['unit'] ('hf', 'vllm', 'sglang', 'ep_rollout')"
