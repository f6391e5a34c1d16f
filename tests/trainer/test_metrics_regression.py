"""Same seed, fp32: a short GRPO run's metrics match values recorded before the per-step overhead work.

The overhead cuts (config reads in the rollout, one shared SamplingParams per engine call, the one-rank weight
push handing over local shards, the LM head on response positions only) must not change what a run computes.
``tests/trainer/data/metrics_regression.json`` holds the metrics of the run below recorded at commit 661c454
(before those cuts), on a 2-core AVX-512 host with torch 2.13.0+cpu. The run uses the paths the cuts touched:
one FSDP2 worker (one-rank push), the vLLM rollout in its default request-level mode, a reference model with a
KL loss (actor and reference forwards), fp32 everywhere; and, since then, the samples of a prompt computed as one
packed row (``model.share_prompt_prefix``, on by default for CPU runs with rollout.n > 1).

To record again (only after a change that is meant to alter the numerics, saying why in the commit):
    python tests/trainer/test_metrics_regression.py --record tests/trainer/data/metrics_regression.json
"""

import importlib.util
import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.vllm,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm not installed"),
]

REPO = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).with_name("data") / "metrics_regression.json"
STEPS = 3
# metrics compared: what the run computed (losses, rewards, lengths, log-prob agreement), not timings
KEYS = ("actor/pg_loss", "actor/kl_loss", "actor/entropy", "actor/grad_norm", "actor/ppo_kl",
        "critic/score/mean", "critic/advantages/max", "critic/advantages/min", "response_length/mean",
        "prompt_length/mean", "training/rollout_probs_diff_mean")
REL_TOL, ABS_TOL = 1e-4, 1e-6

REWARD_PY = textwrap.dedent('''
    def compute_score(data_source, solution_str, ground_truth, extra_info=None):
        return sum(ch.isdigit() for ch in solution_str) / max(1, len(solution_str))
''')


def run_short_grpo(root: Path) -> dict:
    """Builds the tiny model and data under ``root``, runs 3 GRPO steps, returns {step: {metric: value}}."""
    from verl.utils.embedded import make_model_dir

    root.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1", RAY_AUTH_MODE="disabled",
               TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1", VLLM_CPU_KVCACHE_SPACE="1",
               VERL_FILE_LOGGER_PATH=str(root / "metrics.jsonl"))
    subprocess.run([sys.executable, str(REPO / "examples/data_preprocess/arithmetic.py"), "--local_dir",
                    str(root / "data"), "--train_size", "64", "--test_size", "8"], check=True, cwd=REPO, env=env)
    (root / "reward.py").write_text(REWARD_PY)
    model = make_model_dir(str(root / "model"), size="tiny", seed=0)
    args = [
        "algorithm.adv_estimator=grpo",
        f"data.train_files={root / 'data' / 'train.parquet'}",
        f"data.val_files={root / 'data' / 'test.parquet'}",
        "data.train_batch_size=8", "data.max_prompt_length=48", "data.max_response_length=16", "data.seed=1",
        f"actor_rollout_ref.model.path={model}",
        "actor_rollout_ref.actor.optim.lr=1e-3",
        "actor_rollout_ref.actor.ppo_mini_batch_size=8", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
        "actor_rollout_ref.actor.use_kl_loss=True", "actor_rollout_ref.actor.kl_loss_coef=0.01",
        "actor_rollout_ref.actor.fsdp_config.dtype=fp32", "actor_rollout_ref.ref.fsdp_config.dtype=fp32",
        "actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.dtype=float32",
        "actor_rollout_ref.rollout.n=4", "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=16",
        "actor_rollout_ref.rollout.max_num_seqs=64",
        "algorithm.use_kl_in_reward=False",
        f"custom_reward_function.path={root / 'reward.py'}",
        "trainer.logger=[console,file]", "trainer.val_before_train=False",
        "trainer.n_gpus_per_node=1", "trainer.nnodes=1", "trainer.save_freq=-1", "trainer.test_freq=-1",
        f"trainer.total_training_steps={STEPS}",
    ]
    with open(root / "log.txt", "w") as log:
        proc = subprocess.run([sys.executable, "-m", "verl.trainer.main_ppo", *args], cwd=root, env=env,
                              stdout=log, stderr=subprocess.STDOUT, timeout=900)
    assert proc.returncode == 0, (root / "log.txt").read_text()[-6000:]
    steps: dict = {}
    for line in (root / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        if "data" in record:
            steps.setdefault(str(record["step"]), {}).update(
                {k: v for k, v in record["data"].items() if k in KEYS})
    return steps


def test_short_run_metrics_match_the_recorded_run(tmp_path):
    golden = json.loads(GOLDEN.read_text())
    got = run_short_grpo(tmp_path / "run")
    assert sorted(got) == sorted(golden["steps"]) == [str(s) for s in range(1, STEPS + 1)]
    for step, expected in golden["steps"].items():
        assert sorted(expected) == sorted(KEYS) and sorted(got[step]) == sorted(KEYS), (step, sorted(got[step]))
        for key, value in expected.items():
            assert math.isclose(got[step][key], value, rel_tol=REL_TOL, abs_tol=ABS_TOL), (
                f"step {step} {key}: {got[step][key]!r}, recorded {value!r}")
    # on CPU with rollout.n=4 the samples of a prompt share its forward (chosen by the host-aware defaults), so
    # the recorded numbers also check that path
    log = (tmp_path / "run" / "log.txt").read_text()
    assert "share_prompt_prefix: False -> True" in log and "computed as one packed row per prompt" in log
    # the run really trained: the policy moved and the rewards were not constant
    assert any(abs(m["actor/pg_loss"]) > 0 for m in got.values())
    assert any(m["actor/kl_loss"] > 0 for m in got.values())


if __name__ == "__main__":
    import argparse
    import subprocess as sp
    import tempfile

    parser = argparse.ArgumentParser(description="record the reference metrics of the short run")
    parser.add_argument("--record", required=True, help="JSON file to write")
    out = Path(parser.parse_args().record)
    with tempfile.TemporaryDirectory() as tmp:
        steps = run_short_grpo(Path(tmp) / "run")
    commit = sp.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp_out = out.with_suffix(".tmp")
    tmp_out.write_text(json.dumps({"commit": commit, "steps": steps}, indent=1, sort_keys=True) + "\n")
    os.replace(tmp_out, out)
    print(f"wrote {out} ({len(steps)} steps) at {commit}")
