"""Registry errors (reward managers, advantage estimators, policy losses), the import direction between
protocol, single controller and trainer, Role's one home, and the fused colocated worker class in-process."""

from __future__ import annotations

import subprocess
import sys

import pytest

from verl.single_controller.base import Worker
from verl.single_controller.base.decorator import Dispatch, register
from verl.single_controller.ray import RayClassWithInitArgs
from verl.single_controller.ray.base import FusedWorkerCLSName, create_colocated_worker_raw_cls
from verl.trainer.ppo import core_algos
from verl.workers import reward_manager
from verl.workers.reward_manager import registry


# ---------------------------------------------------------------------------------------- reward managers
def test_unknown_reward_manager_is_a_value_error_listing_the_registered_ones():
    with pytest.raises(ValueError) as info:
        reward_manager.get_reward_manager_cls("naïve")
    msg = str(info.value)
    assert "Unknown reward manager 'naïve'" in msg
    for name in ("naive", "batch", "prime", "dapo"):
        assert name in msg
    assert "reward_model.reward_manager" in msg


def test_empty_registry_says_so(monkeypatch):
    monkeypatch.setattr(registry, "REWARD_MANAGER_REGISTRY", {})
    with pytest.raises(ValueError, match="Registered: none \\(the registry is empty\\)"):
        registry.get_reward_manager_cls("naive")


def test_registering_a_second_class_under_a_taken_name_fails_and_the_same_class_is_idempotent():
    naive = reward_manager.get_reward_manager_cls("naive")
    assert reward_manager.register("naive")(naive) is naive  # re-registering the same class is a no-op

    class Other(reward_manager.AbstractRewardManager):
        pass

    with pytest.raises(ValueError, match="already registered"):
        reward_manager.register("naive")(Other)
    assert reward_manager.get_reward_manager_cls("naive") is naive
    with pytest.raises(ValueError, match="non-empty str"):
        reward_manager.register("")
    with pytest.raises(TypeError, match="must be a str"):
        reward_manager.get_reward_manager_cls(None)


def test_custom_manager_registers_and_resolves():
    @reward_manager.register("compat_test_manager")
    class Mine(reward_manager.NaiveRewardManager):
        pass

    try:
        assert reward_manager.get_reward_manager_cls("compat_test_manager") is Mine
    finally:
        registry.REWARD_MANAGER_REGISTRY.pop("compat_test_manager")


def test_algorithm_registries_raise_value_errors_like_verl():
    with pytest.raises(ValueError, match="grpo_vectorised"):
        core_algos.get_adv_estimator_fn("grpo_vectorised")
    with pytest.raises(ValueError, match="already registered"):
        core_algos.register_adv_est("grpo")(lambda **kw: None)
    with pytest.raises(ValueError, match="vanila"):
        core_algos.get_policy_loss_fn("vanila")


# ------------------------------------------------------------------------------------------------ layering
def run(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def test_import_direction_protocol_then_single_controller_then_trainer_and_role_has_one_home():
    """One fresh interpreter (imports are cached per process): protocol loads neither Ray nor the controller;
    the controller does not load the trainer; every old path to Role gives the enum of verl.trainer.ppo.utils."""
    out = run("import sys\n"
              "import verl.protocol\n"
              "print(sorted(m for m in sys.modules if m == 'ray' or m.startswith(('ray.', 'verl.single_controller'))))\n"
              "import verl.single_controller.ray as r\n"
              "print(any(m.startswith('verl.trainer') for m in sys.modules))\n"
              "from verl.single_controller.ray import Role as A\n"
              "from verl.single_controller.ray.base import Role as B\n"
              "from verl.trainer.ppo.ray_trainer import Role as C\n"
              "from verl.trainer.ppo.utils import Role as D\n"
              "print(A is B is C is D, D.__module__, str(D.ActorRollout), D.from_string('ref') is D.RefPolicy)")
    protocol_loads, controller_loads_trainer, role = out.strip().splitlines()
    assert protocol_loads == "[]"
    assert controller_loads_trainer == "False"
    assert role == "True verl.trainer.ppo.utils actor_rollout True"


# ----------------------------------------------------------------------------------- fused worker, in-process
class Adder(Worker):
    def __init__(self, offset: int):
        super().__init__()
        self.offset = offset

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def add(self, x):
        return x + self.offset

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def peer_offset(self, role):
        return self.fused_worker_dict[role].offset


def test_raw_colocated_class_hosts_every_role_in_one_object():
    cls = create_colocated_worker_raw_cls({"a": RayClassWithInitArgs(Adder, 1), "b": RayClassWithInitArgs(Adder, 10)})
    assert isinstance(cls, type) and issubclass(cls, Worker) and not hasattr(cls, "remote")
    assert cls.__name__ == f"{FusedWorkerCLSName}_a_b" and cls.raw_cls_dict == {"a": Adder, "b": Adder}
    fused = cls()
    assert fused._fuw_execute("a", "add", 5) == 6 and fused._fuw_execute("b", "add", 5) == 15
    assert fused.b.offset == 10 and set(fused.fused_worker_dict) == {"a", "b"}
    assert fused.a.peer_offset("b") == 10  # roles see each other through fused_worker_dict
    with pytest.raises(ValueError, match="no role 'c'"):
        fused._fuw_execute("c", "add", 1)


def test_a_same_named_class_from_another_module_does_not_silently_replace_a_manager():
    naive = reward_manager.get_reward_manager_cls("naive")
    impostor = type(naive.__name__, (reward_manager.AbstractRewardManager,), {"__module__": "my_project.rewards"})
    impostor.__qualname__ = naive.__qualname__
    with pytest.raises(ValueError, match="already registered"):
        reward_manager.register("naive")(impostor)
    assert reward_manager.get_reward_manager_cls("naive") is naive
