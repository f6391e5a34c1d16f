"""`python -m recipe.rejection_sampling.main_rejection_sampling` end to end on the tiny model and the embedded
arithmetic prompts (CPU, Ray, HF rollout, real generation): one run trains 4 iterations with checkpoints at
steps 2 and 4 and greedy validation before and after; a second run resumes from step 2 and must log the same
step-3/4 metrics.

An untrained model almost never gets an answer right (~1% of samples), so the rule reward gives 0.5 for a
response that holds some integer (`format_score`, the embedded scorer's partial credit) and the bar is 0.5:
about 30% of the samples pass at first. Fine-tuning on the accepted samples must make them more common: every
held-out greedy answer starts with no integer (score 0) and the fine-tuned policy's must score more.
"""

import math
import shutil

import pytest

from recipe_runs import run_recipe  # tests/recipe is on sys.path (pytest rootdir-less import mode)

pytestmark = pytest.mark.e2e

MODULE = "recipe.rejection_sampling.main_rejection_sampling"
PROMPTS, N, MIN_SCORE = 16, 8, 0.5


@pytest.fixture(scope="module")
def assets(arith_rl_assets):
    return arith_rl_assets


def _args(a, ckpt):
    return [f"data.train_files={a['train']}", f"data.val_files={a['test']}",
            f"actor_rollout_ref.model.path={a['model']}",
            f"data.train_batch_size={PROMPTS}", f"actor_rollout_ref.rollout.n={N}",
            "+reward_model.reward_kwargs.format_score=0.5", f"rejection_sampling.min_score={MIN_SCORE}",
            "rejection_sampling.keep_per_prompt=1", "rejection_sampling.sft_mini_batch_size=16",
            "rejection_sampling.micro_batch_size_per_gpu=16", "actor_rollout_ref.actor.optim.lr=3e-3",
            "trainer.total_training_steps=4", "trainer.test_freq=4", "trainer.save_freq=2",
            f"trainer.default_local_dir={ckpt}", "trainer.logger=[console,file]"]


def test_rft_accepts_above_the_bar_improves_checkpoints_and_resumes(assets, tmp_path):
    ckpt = tmp_path / "ckpt"
    full, _ = run_recipe(MODULE, tmp_path / "full", _args(assets, ckpt))
    assert sorted(full) == [0, 1, 2, 3, 4]
    val = "val-core/arithmetic/reward/mean@1"
    for step in (1, 2, 3, 4):
        m = full[step]
        for key in ("actor/sft_loss", "actor/grad_norm", "critic/score/mean", "response_length/mean"):
            assert math.isfinite(m[key]), (step, key)
        # best-of-n with keep_per_prompt=1: one kept sample per prompt that has any sample at the bar, and
        # every kept sample is at the bar
        assert 0 < m["rejection_sampling/acceptance_rate"] < 1, m
        assert m["rejection_sampling/kept_samples"] == round(m["rejection_sampling/prompts_with_accepted"] * PROMPTS)
        assert m["rejection_sampling/kept_score/min"] >= MIN_SCORE
        assert m["rejection_sampling/kept_score/mean"] >= m["critic/score/mean"]
    # the method: fine-tuning on accepted samples makes the policy produce them (greedy, held-out prompts)
    assert full[0][val] == 0.0 and full[4][val] > 0.0, (full[0][val], full[4][val])
    assert (ckpt / "global_step_2" / "actor").is_dir() and (ckpt / "global_step_4" / "actor").is_dir()

    resumed_dir = tmp_path / "resume_ckpt"
    shutil.copytree(ckpt / "global_step_2", resumed_dir / "global_step_2")
    (resumed_dir / "latest_checkpointed_iteration.txt").write_text("2")
    resumed, log = run_recipe(MODULE, tmp_path / "resumed", _args(assets, resumed_dir))
    assert "resumed from" in log and sorted(resumed) == [3, 4]
    for step in (3, 4):
        for key in ("critic/score/mean", "rejection_sampling/kept_samples", "actor/sft_loss", "actor/grad_norm"):
            assert resumed[step][key] == pytest.approx(full[step][key], rel=1e-4, abs=1e-6), (step, key)
    assert resumed[4][val] == pytest.approx(full[4][val])
