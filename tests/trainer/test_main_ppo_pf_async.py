"""End-to-end: PF-PPO, the asynchronous reward function and reward-loop workers together, `python -m
verl.trainer.main_ppo`, 2 steps.

PPO with GAE (PF-PPO resamples only with GAE, as in verl), `algorithm.pf_ppo.reweight_method=max_min`,
`reward_model.launch_reward_fn_async=True` and `reward_model.num_workers=2`: the Ray task of the async reward hands
the rows to two reward-loop actors. The scoring function logs every call with the process it ran in. Reuses the
assets and helpers of test_main_ppo_e2e.py.
"""

import json
import math
import textwrap

import pytest
from test_main_ppo_e2e import assets, quickstart_args, run_main  # noqa: F401  (assets is a fixture)

pytestmark = pytest.mark.e2e

LOGGING_REWARD_PY = textwrap.dedent('''
    import json
    import os

    import ray

    LOG = {log!r}

    def compute_score(data_source, solution_str, ground_truth, extra_info=None):
        score = sum(map(ord, solution_str)) % 97 / 97  # deterministic, spread out: PF-PPO has rows to drop
        where = "actor" if ray.get_runtime_context().get_actor_id() else "task"
        with open(LOG, "a") as f:
            f.write(json.dumps({{"where": where, "pid": os.getpid(), "score": score}}) + "\\n")
        return score
''')


def test_pf_ppo_max_min_with_async_reward(assets, tmp_path):  # noqa: F811
    run = tmp_path / "pf_async"
    run.mkdir()
    calls_log, reward_py = run / "reward_calls.jsonl", run / "reward.py"
    reward_py.write_text(LOGGING_REWARD_PY.format(log=str(calls_log)))
    steps, rows = 2, 8  # data.train_batch_size=8, rollout.n=1
    metrics = run_main(run, quickstart_args(assets, steps=steps) + [
        f"custom_reward_function.path={reward_py}",
        "algorithm.use_pf_ppo=True",
        "algorithm.pf_ppo.reweight_method=max_min",
        "reward_model.launch_reward_fn_async=True",
        "reward_model.num_workers=2",
        f"trainer.rollout_data_dir={run / 'rollouts'}",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
    ])
    assert sorted(metrics) == [1, 2]
    calls = [json.loads(line) for line in calls_log.read_text().splitlines()]
    # every training score came from the two reward-loop actors (half of each step's rows each), none from the
    # driver or the async task itself
    assert [c["where"] for c in calls] == ["actor"] * (steps * rows)
    pids = [c["pid"] for c in calls]
    assert len(set(pids)) == 2 and all(pids.count(p) == steps * rows // 2 for p in set(pids))

    for step in (1, 2):
        m = metrics[step]
        bad = {k: v for k, v in m.items() if isinstance(v, (int, float)) and not math.isfinite(v)}
        assert not bad, f"step {step}: non-finite metrics {bad}"
        for name in ("actor/pg_loss", "critic/vf_loss", "critic/advantages/mean", "timing_s/reward"):
            assert name in m, f"step {step}: {name} missing"

        step_scores = [c["score"] for c in calls[(step - 1) * rows: step * rows]]
        best, worst = max(step_scores), min(step_scores)
        n_extreme = sum(s in (best, worst) for s in step_scores)
        assert best > worst and n_extreme < rows, "the step needs middling responses for the filter to drop"
        # max_min: the trained batch holds only copies of the best and the worst responses of the step
        assert 1 <= m["pf_ppo/unique_rows"] <= n_extreme
        dumped = [json.loads(line)["score"] for line in (run / "rollouts" / f"{step}.jsonl").read_text().splitlines()]
        assert len(dumped) == rows
        assert all(s == pytest.approx(best, abs=1e-6) or s == pytest.approx(worst, abs=1e-6) for s in dumped)
        assert m["critic/score/max"] <= best + 1e-6 and m["critic/score/min"] >= worst - 1e-6
