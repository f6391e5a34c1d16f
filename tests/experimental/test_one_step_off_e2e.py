"""One-step-off-policy GRPO end to end on the tiny model (CPU, HF rollout, 1 actor process + 1 rollout process):
3 steps through ``python -m verl.experimental.one_step_off_policy.main_ppo``'s code path, then a check that the
actor's weights really reach the rollout process: on a batch generated right after a push, rollout and trainer
log-probs agree (fp32), while a batch generated with the stale weights shows the gap."""

import json
import subprocess
import sys
import textwrap

import pytest

from tests.trainer.test_main_ppo_e2e import _env, assets, quickstart_args, read_metrics  # noqa: F401 (fixture)

pytestmark = pytest.mark.e2e

# the entry point's own main(), with a trainer that measures the push at the end of the run
SCRIPT = textwrap.dedent('''
    import json, os, sys
    from omegaconf import open_dict
    from verl.experimental.one_step_off_policy import main_ppo as entry
    from verl.experimental.one_step_off_policy.ray_trainer import OneStepOffRayTrainer
    from verl.trainer.ppo.ray_trainer import compute_response_mask
    from verl.protocol import DataProto

    class CheckedTrainer(OneStepOffRayTrainer):
        def _gap(self):
            batch = DataProto.from_single_dict(next(iter(self.train_dataloader)))
            prompts = self._prepare_prompts(batch)
            out = self._collect(self._launch_generation(prompts, None))
            full = prompts[0].repeat(repeat_times=int(self.config.actor_rollout_ref.rollout.n),
                                     interleave=True).union(out)
            full.batch["response_mask"] = compute_response_mask(full)
            metrics = {}
            self._compute_old_log_prob(full, metrics)
            return metrics["training/rollout_probs_diff_max"]

        def _finish(self):
            s = self._schedule
            result = {"actor_version": s.actor_version, "rollout_version_before": s.rollout_version,
                      "stale_gap": self._gap()}
            self._push_weights(s.actor_version)
            result["push_s"] = self._last_push_s
            result["fresh_gap"] = self._gap()
            # an absolute path: the trainer runs in a Ray worker, whose working directory is the cluster's
            out = os.path.join(os.path.dirname(os.environ["VERL_FILE_LOGGER_PATH"]), "push_check.json")
            with open(out, "w") as f:
                json.dump(result, f)
            super()._finish()

    class Runner(entry.OneStepOffTaskRunner):
        def run(self, config, placement="colocate"):
            from functools import partial
            self.trainer_cls = partial(CheckedTrainer, rollout_pool_spec=self.rollout_pool.spec)
            entry.TaskRunner.run(self, config, placement)

    entry.runner_for = lambda pool: type("R", (Runner,), {"rollout_pool": pool})
    entry.quiet_searchpath_warning()
    entry.precheck_cli(["--config-path", entry.CONFIG_DIR, "--config-name", entry.CONFIG_NAME, *sys.argv[1:]])
    entry.main()
''')


def one_step_off_args(a, steps):
    args = [x for x in quickstart_args(a, steps=steps) if not x.startswith(("critic.", "trainer.n_gpus_per_node",
                                                                                     "trainer.test_freq"))]
    return args + [
        "algorithm.adv_estimator=grpo",
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.rollout.mode=sync",
        "trainer.n_gpus_per_node=1",
        "rollout.n_gpus_per_node=1",
        "trainer.device=cpu",
        "trainer.test_freq=-1",  # no validation: it would push the last version before the end-of-run check
    ]


def test_one_step_off_grpo_three_steps(assets, tmp_path):
    run = tmp_path / "osop"
    run.mkdir()
    (run / "run.py").write_text(SCRIPT)
    with open(run / "log.txt", "w") as log:
        proc = subprocess.run([sys.executable, "run.py", *one_step_off_args(assets, steps=3)], cwd=run,
                              env=_env(run), stdout=log, stderr=subprocess.STDOUT, timeout=600)
    text = (run / "log.txt").read_text()
    assert proc.returncode == 0, text[-6000:]
    assert "One-step-off pools: {'global_pool': [1], 'rollout_pool': [1]}" in text
    metrics = read_metrics(run)
    assert sorted(metrics) == [1, 2, 3]
    for step, m in metrics.items():
        for name in ("actor/pg_loss", "critic/score/mean", "training/rollout_probs_diff_max", "timing_s/gen",
                     "timing_s/step"):
            assert name in m and m[name] == m[name] and abs(m[name]) != float("inf"), (step, name)
        # step 1 synchronous, then each batch sampled with the weights one update older than the actor
        assert m["one_step_off/rollout_weight_version"] == max(step - 2, 0)
        assert m["one_step_off/actor_weight_version"] == step - 1
        assert m["one_step_off/staleness"] == (0 if step == 1 else 1)
    # step 1: the rollout holds exactly the actor's weights; later steps see the one-update gap
    assert metrics[1]["training/rollout_probs_diff_max"] < 1e-3
    assert metrics[3]["training/rollout_probs_diff_max"] > 1e-3
    check = json.loads((run / "push_check.json").read_text())
    assert check["actor_version"] == 3 and check["rollout_version_before"] == 1
    assert check["stale_gap"] > 1e-3, check
    assert check["fresh_gap"] < 1e-3, check  # the push reached the rollout process
    print(json.dumps(check))
