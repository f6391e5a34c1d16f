"""`python -m recipe.dapo.main_dapo` end to end on the tiny model and the embedded arithmetic prompts (CPU, Ray,
HF rollout): dynamic sampling on, overlong shaping on, checkpoint and resume; bad configs exit 2 before Ray.

The rule reward makes the prompts with an even answer "too easy" (every response scores 1, so their groups carry
no signal and must be dropped) and scores the other responses by the parity of their length, so a step needs
more than one generation round now and then and its kept groups all have mixed scores.
"""

import json
import math
import shutil
import textwrap

import pytest

from ray_nodes import ray_was_used
from recipe_runs import run_recipe  # tests/recipe is on sys.path (pytest rootdir-less import mode)

pytestmark = pytest.mark.e2e

MODULE = "recipe.dapo.main_dapo"

REWARD_PY = textwrap.dedent('''
    def compute_score(data_source, solution_str, ground_truth, extra_info=None):
        if int(ground_truth) % 2 == 0:
            return 1.0                        # every response "right": the group has zero spread
        return float(len(solution_str) % 2)   # the others: right or wrong by chance
''')


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    import pandas as pd

    from verl.utils.embedded import make_model_dir
    from verl.utils.embedded.arithmetic import make_rl_rows

    root = tmp_path_factory.mktemp("dapo_assets")
    pd.DataFrame(make_rl_rows(48, "train", seed=0)).to_parquet(root / "train.parquet")
    pd.DataFrame(make_rl_rows(8, "test", seed=1)).to_parquet(root / "test.parquet")
    (root / "reward.py").write_text(REWARD_PY)
    return {"model": make_model_dir(str(root / "model"), size="tiny", seed=0), "root": root}


def _args(a, ckpt, steps=3):
    return [f"data.train_files={a['root'] / 'train.parquet'}", f"data.val_files={a['root'] / 'test.parquet'}",
            f"actor_rollout_ref.model.path={a['model']}", f"custom_reward_function.path={a['root'] / 'reward.py'}",
            "data.train_batch_size=4", "data.gen_batch_size=6", "data.max_prompt_length=32",
            "data.max_response_length=8", "algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=4",
            "algorithm.filter_groups.enable=true", "algorithm.filter_groups.metric=acc",
            "algorithm.filter_groups.max_num_gen_batches=10",
            "reward_model.overlong_buffer.enable=true", "reward_model.overlong_buffer.len=4",
            "reward_model.overlong_buffer.penalty_factor=0.5", "reward_model.overlong_buffer.log=true",
            "actor_rollout_ref.actor.clip_ratio_low=0.2", "actor_rollout_ref.actor.clip_ratio_high=0.28",
            "actor_rollout_ref.actor.loss_agg_mode=token-mean", "actor_rollout_ref.actor.use_kl_loss=false",
            "actor_rollout_ref.actor.optim.lr=1e-3", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16", "actor_rollout_ref.rollout.name=hf",
            "actor_rollout_ref.actor.fsdp_config.dtype=fp32", "trainer.n_gpus_per_node=1",
            "trainer.val_before_train=false", "trainer.test_freq=-1", "trainer.save_freq=2",
            f"trainer.total_training_steps={steps}", f"trainer.default_local_dir={ckpt}",
            "trainer.logger=[console,file]"]


def test_dapo_dynamic_sampling_checkpoints_and_resumes(assets, tmp_path):
    ckpt = tmp_path / "ckpt"
    dump = tmp_path / "rollouts"
    full, log = run_recipe(MODULE, tmp_path / "full", _args(assets, ckpt) + [f"trainer.rollout_data_dir={dump}"])
    assert sorted(full) == [1, 2, 3]
    for step in (1, 2, 3):
        m = full[step]
        assert m["train/num_gen_batches"] >= 1 and m["train/kept_groups"] >= 4
        assert math.isfinite(m["actor/pg_loss"]) and math.isfinite(m["actor/grad_norm"])
        # the trained batch: exactly train_batch_size groups of n, each with right and wrong answers
        rows = [json.loads(line) for line in (dump / f"{step}.jsonl").read_text().splitlines()]
        groups = {}
        for row in rows:
            groups.setdefault(row["uid"], []).append(row["acc"])
        assert len(rows) == 16 and len(groups) == 4 and all(len(g) == 4 for g in groups.values())
        assert all(0 < sum(g) < 4 for g in groups.values()), groups
    rounds = sum(full[s]["train/num_gen_batches"] for s in (1, 2, 3))
    dropped = sum(full[s]["train/dropped_groups"] for s in (1, 2, 3))
    assert dropped > 0  # the even-answer prompts' groups were filtered out
    assert rounds * 6 == sum(full[s]["train/kept_groups"] + full[s]["train/dropped_groups"] for s in (1, 2, 3))
    assert (ckpt / "global_step_2" / "actor").is_dir() and (ckpt / "global_step_3" / "actor").is_dir()

    resumed_dir = tmp_path / "resume_ckpt"
    shutil.copytree(ckpt / "global_step_2", resumed_dir / "global_step_2")
    (resumed_dir / "latest_checkpointed_iteration.txt").write_text("2")
    resumed, log = run_recipe(MODULE, tmp_path / "resumed", _args(assets, resumed_dir))
    assert "Resuming from" in log and sorted(resumed) == [3]
    for key in ("train/num_gen_batches", "train/kept_groups", "train/dropped_groups", "critic/score/mean"):
        assert resumed[3][key] == pytest.approx(full[3][key], rel=1e-5), key


@pytest.mark.parametrize("module, override, message", [
    (MODULE, "algorithm.filter_groups.metric=accuracy", "algorithm.filter_groups.metric='accuracy' is not one of"),
    (MODULE, "data.gen_batch_size=2", "data.gen_batch_size=2 is smaller than data.train_batch_size=4"),
    ("verl.trainer.main_ppo", "+algorithm.filter_groups.enable=true", "runs in the DAPO recipe: python -m recipe.dapo"),
])
def test_bad_config_exits_2_before_ray(assets, tmp_path, module, override, message):
    args = _args(assets, tmp_path / "ckpt") + [override]
    if module != MODULE:  # main_ppo's yaml has no DAPO keys: keep only the shared ones
        args = [a for a in args if not a.startswith(("algorithm.filter_groups", "reward_model.overlong",
                                                     "data.gen_batch_size"))]
    _, log = run_recipe(module, tmp_path / "run", args, expect_rc=2)
    assert "Config error" in log and message in log, log[-2000:]
    assert not ray_was_used(log) and not (tmp_path / "ckpt").exists()
