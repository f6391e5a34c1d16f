"""One-step-off-policy: the step schedule (with a fake generator) and the entry point's config checks."""

import subprocess
import sys

import pytest
from hydra import compose, initialize_config_dir

from verl.experimental.one_step_off_policy.main_ppo import (CONFIG_DIR, CONFIG_NAME, check_one_step_off_config,
                                                            shared_ppo_config)
from verl.experimental.one_step_off_policy.ray_trainer import OneStepOffSchedule
from verl.utils.config import ConfigError


class FakeRollout:
    """Generates 'responses' tagged with the weights it holds; records the order of events."""

    def __init__(self):
        self.weights = "model-file"
        self.events = []

    def push(self, version):
        self.events.append(("push", version))
        self.weights = version

    def launch(self, prompts, version):
        assert self.weights == version, "launched with weights other than the actor's current version"
        self.events.append(("launch", prompts))
        return {"prompts": prompts, "sampled_with": self.weights}


def run_schedule(steps, start_version=0):
    rollout = FakeRollout()
    schedule = OneStepOffSchedule(rollout.launch, rollout.push)
    schedule.actor_version = start_version
    trained = []
    for k in range(1, steps + 1):
        nxt = f"p{k + 1}" if k < steps else None
        current = schedule.step(f"p{k}", nxt)
        trained.append((k, current.future["prompts"], current.future["sampled_with"], schedule.staleness(current)))
        schedule.actor_version += 1  # the update of step k
    return trained, rollout.events, schedule


def test_step_k_trains_on_batch_k_sampled_one_update_behind():
    trained, events, schedule = run_schedule(4)
    # step 1 is synchronous (version 0, staleness 0); step k >= 2 trains on batch k sampled with version k-2,
    # one update older than the actor (version k-1) that computes its old log-probs
    assert trained == [(1, "p1", 0, 0), (2, "p2", 0, 1), (3, "p3", 1, 1), (4, "p4", 2, 1)]
    # the next batch is launched before the current one is trained on; the last step launches nothing
    assert events == [("push", 0), ("launch", "p1"), ("launch", "p2"),
                      ("push", 1), ("launch", "p3"), ("push", 2), ("launch", "p4")]
    assert schedule.in_flight is None


def test_overlap_false_is_the_synchronous_baseline():
    rollout = FakeRollout()
    schedule = OneStepOffSchedule(rollout.launch, rollout.push, overlap=False)
    for k in (1, 2, 3):
        current = schedule.step(f"p{k}", f"p{k + 1}")
        assert current.future == {"prompts": f"p{k}", "sampled_with": k - 1} and schedule.staleness(current) == 0
        assert schedule.in_flight is None
        schedule.actor_version += 1
    assert rollout.events == [("push", 0), ("launch", "p1"), ("push", 1), ("launch", "p2"), ("push", 2),
                              ("launch", "p3")]


def test_resume_regenerates_the_in_flight_batch_synchronously():
    # resumed after step 2 (actor version 2): nothing is in flight, so step 3 generates its own batch with the
    # restored weights, pushed first because the rollout holds the model file
    rollout = FakeRollout()
    schedule = OneStepOffSchedule(rollout.launch, rollout.push)
    schedule.actor_version = 2
    current = schedule.step("p3", "p4")
    assert current.future == {"prompts": "p3", "sampled_with": 2} and schedule.staleness(current) == 0
    assert rollout.events == [("push", 2), ("launch", "p3"), ("launch", "p4")]


def _compose(*overrides):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        return compose(config_name=CONFIG_NAME, overrides=list(overrides))


def test_config_defaults_and_shared_config():
    cfg = _compose("trainer.device=cpu")
    pool = check_one_step_off_config(cfg)
    assert pool.spec == [1]
    assert cfg.actor_rollout_ref.rollout.calculate_log_probs is True
    shared = shared_ppo_config(cfg)
    assert "rollout" not in shared and shared.ray_init.num_cpus >= 3


@pytest.mark.parametrize("overrides, key", [
    (["actor_rollout_ref.hybrid_engine=True"], "actor_rollout_ref.hybrid_engine=True"),
    (["rollout.n_gpus_per_node=4096"], "rollout.n_gpus_per_node=4096"),
    (["rollout.nnodes=0"], "rollout.nnodes=0"),
    (["algorithm.adv_estimator=remax"], "algorithm.adv_estimator=remax"),
    (["rollout.overlap=3"], "rollout.overlap=3"),
])
def test_config_errors_name_the_key(overrides, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        check_one_step_off_config(_compose("trainer.device=cpu", *overrides))


def test_entry_point_refuses_hybrid_engine_before_workers_start(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "verl.experimental.one_step_off_policy.main_ppo",
                           "actor_rollout_ref.hybrid_engine=True", "trainer.device=cpu"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Config error: actor_rollout_ref.hybrid_engine=True" in proc.stderr
    assert "ray" not in [p.name for p in tmp_path.iterdir()]
