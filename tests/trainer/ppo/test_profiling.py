"""The trainer's side of profiling: which steps start and stop the workers' profilers, on which worker groups."""

import pytest
from omegaconf import OmegaConf

from verl.trainer.config_schema.ppo import as_ppo_config
from verl.trainer.ppo.profiling import ProfilingMixin


class FakeGroup:
    def __init__(self, log, name):
        self.log, self.name = log, name

    def start_profile(self, **kwargs):
        self.log.append((self.name, "start", kwargs.get("profile_step")))

    def stop_profile(self):
        self.log.append((self.name, "stop"))


class Trainer(ProfilingMixin):
    def __init__(self, steps, continuous=False):
        self.config = OmegaConf.create({"global_profiler": {"steps": steps, "profile_continuous_steps": continuous}})
        self.typed_config = as_ppo_config(self.config)  # what RayPPOTrainer reads (schema defaults elsewhere)
        self.log = []
        self.actor_rollout_wg = FakeGroup(self.log, "actor_rollout")
        self.ref_policy_wg = self.actor_rollout_wg  # LoRA: the reference is the actor's own group
        self.critic_wg = FakeGroup(self.log, "critic")
        self.rm_wg = None
        self.global_steps = 0

    def run(self, n):
        for self.global_steps in range(1, n + 1):
            start, stop = self._profile_bounds()
            self._start_profiling(start)
            self._stop_profiling(stop)
        return self.log


def test_each_listed_step_is_started_and_stopped_on_every_group_once():
    assert Trainer([2, 3]).run(4) == [("actor_rollout", "start", 2), ("critic", "start", 2), ("actor_rollout", "stop"),
                                      ("critic", "stop"), ("actor_rollout", "start", 3), ("critic", "start", 3),
                                      ("actor_rollout", "stop"), ("critic", "stop")]


@pytest.mark.parametrize("steps, expected", [
    ([2, 3, 5], [("start", 2), "stop@3", ("start", 5), "stop@5"]),
    ([1], [("start", 1), "stop@1"]),
])
def test_continuous_steps_are_profiled_as_one(steps, expected):
    trainer = Trainer(steps, continuous=True)
    trainer.critic_wg = None
    seen = []
    for trainer.global_steps in range(1, 6):
        start, stop = trainer._profile_bounds()
        if start:
            seen.append(("start", trainer.global_steps))
        if stop:
            seen.append(f"stop@{trainer.global_steps}")
    assert seen == expected


def test_no_steps_no_calls():
    assert Trainer(None).run(3) == [] and Trainer([]).run(3) == []


def test_a_group_that_cannot_be_profiled_is_named_and_skipped(capsys):
    trainer = Trainer([1])
    trainer.critic_wg = object()  # a worker class without DistProfilerExtension
    assert trainer.run(1) == [("actor_rollout", "start", 1), ("actor_rollout", "stop")]
    assert "critic_wg's worker class has no start_profile/stop_profile" in capsys.readouterr().out
