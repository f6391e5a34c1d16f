"""The online preference recipes end to end on the tiny model and the embedded arithmetic data (CPU, Ray, real
FSDP2 updates and real generation), a few steps each:

- online DPO: 3 steps with checkpoints at steps 2 and 3; a second run resumes from step 2 and must log the same
  step-3 metrics (sampling included: the rollout seed follows the step); 2 steps with ``online_dpo.pairs=all``;
- SPIN with ``trainer.ref_update_freq=2``: the reference is the policy at steps 0 and 2, so the implicit rewards
  are exactly 0 in the steps that start from a fresh reference (1 and 3) and not in step 2;
- SPPO: 2 steps of the squared loss on win probabilities.

The rule reward gives any integer answer ``format_score`` so that the untrained model's samples disagree.
"""

import math
import shutil

import pytest

from recipe_runs import run_recipe  # tests/recipe is on sys.path (pytest rootdir-less import mode)

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def assets(arith_rl_assets, tmp_path_factory):
    """The shared tiny model and RL prompts (online DPO, SPPO) plus prompt/target files for SPIN."""
    from verl.utils.embedded.arithmetic import ArithmeticConfig
    from verl.utils.embedded.preferences import write_preference_files

    root = tmp_path_factory.mktemp("online_pref_assets")
    files = write_preference_files(str(root / "data"), n_train=32, n_test=8, config=ArithmeticConfig(max_digits=1))
    return {**arith_rl_assets, "spin_train": files["train"], "spin_test": files["test"]}


def _common(a, ckpt, steps, train="train", test="test"):
    return [f"data.train_files={a[train]}", f"data.val_files={a[test]}", f"actor_rollout_ref.model.path={a['model']}",
            "data.train_batch_size=8", "actor_rollout_ref.actor.optim.lr=3e-3", f"trainer.total_training_steps={steps}",
            f"trainer.test_freq={steps}", f"trainer.default_local_dir={ckpt}", "trainer.logger=[console,file]"]


def _dpo_args(a, ckpt):
    return _common(a, ckpt, 3) + ["actor_rollout_ref.rollout.n=4", "online_dpo.beta=0.5", "trainer.save_freq=2",
                                  "online_dpo.micro_batch_size_per_gpu=4", "+reward_model.reward_kwargs.format_score=0.5"]


def test_online_dpo_pairs_trains_checkpoints_and_resumes(assets, tmp_path):
    ckpt = tmp_path / "ckpt"
    full, _ = run_recipe("recipe.online_dpo.main_online_dpo", tmp_path / "full", _dpo_args(assets, ckpt))
    assert sorted(full) == [0, 1, 2, 3] and "val-core/arithmetic/reward/mean@1" in full[3]
    for step in (1, 2, 3):
        m = full[step]
        assert m["online_dpo/pairs"] + m["online_dpo/tied_prompts"] == 8
        assert m["online_dpo/pairs"] >= 1 and m["online_dpo/chosen_score"] > m["online_dpo/rejected_score"]
        for key in ("train/rewards/chosen", "train/rewards/margins", "train/logps/chosen", "actor/dpo_loss",
                    "actor/grad_norm", "critic/score/mean"):
            assert math.isfinite(m[key]), (step, key)
    # the first update starts at the reference: loss log 2, zero implicit rewards; later ones have moved
    assert full[1]["actor/dpo_loss"] == pytest.approx(math.log(2), abs=1e-5)
    assert abs(full[2]["train/rewards/chosen"]) + abs(full[2]["train/rewards/rejected"]) > 1e-4
    assert (ckpt / "global_step_2" / "actor").is_dir() and (ckpt / "global_step_3" / "driver.pt").exists()

    resumed_dir = tmp_path / "resume_ckpt"
    shutil.copytree(ckpt / "global_step_2", resumed_dir / "global_step_2")
    (resumed_dir / "latest_checkpointed_iteration.txt").write_text("2")
    resumed, log = run_recipe("recipe.online_dpo.main_online_dpo", tmp_path / "resumed", _dpo_args(assets, resumed_dir))
    assert "resumed from" in log and sorted(resumed) == [3]
    for key in ("critic/score/mean", "online_dpo/pairs", "train/rewards/margins", "actor/dpo_loss"):
        assert resumed[3][key] == pytest.approx(full[3][key], rel=1e-4, abs=1e-6), key


def test_online_dpo_all_pairs(assets, tmp_path):
    """online_dpo.pairs=all: every two samples of a prompt whose scores differ; with 4 samples scored 0, 0.5 or 1 a
    prompt gives 1 to 6 pairs (k right of n give k (n - k) with two score levels)."""
    args = _common(assets, tmp_path / "ckpt", 2) + ["actor_rollout_ref.rollout.n=4", "online_dpo.beta=0.5",
                                                    "online_dpo.pairs=all", "online_dpo.micro_batch_size_per_gpu=8",
                                                    "+reward_model.reward_kwargs.format_score=0.5",
                                                    "trainer.val_before_train=false"]
    m, _ = run_recipe("recipe.online_dpo.main_online_dpo", tmp_path / "all", args)
    assert sorted(m) == [1, 2]
    for step in (1, 2):
        untied = 8 - m[step]["online_dpo/tied_prompts"]
        assert untied >= 1 and untied <= m[step]["online_dpo/pairs"] <= 6 * untied, step
        assert m[step]["online_dpo/trained_pairs"] == m[step]["online_dpo/pairs"]
        assert m[step]["online_dpo/chosen_score"] > m[step]["online_dpo/rejected_score"]
        assert math.isfinite(m[step]["actor/dpo_loss"]) and m[step]["actor/grad_norm"] > 0
    assert m[1]["actor/dpo_loss"] == pytest.approx(math.log(2), abs=1e-5)
    # more pairs than best_worst would give in at least one step (several samples of a prompt beat another)
    assert max(m[s]["online_dpo/pairs"] - (8 - m[s]["online_dpo/tied_prompts"]) for s in (1, 2)) > 0


def test_spin_reference_is_the_previous_iterate(assets, tmp_path):
    args = _common(assets, tmp_path / "ckpt", 3, "spin_train", "spin_test") + ["trainer.ref_update_freq=2", "actor_rollout_ref.actor.dpo_beta=0.5",
                                                     "spin.micro_batch_size_per_gpu=4"]
    m, log = run_recipe("recipe.spin.main_spin", tmp_path / "spin", args)
    assert sorted(m) == [0, 1, 2, 3] and 0.0 <= m[3]["val/greedy_match"] <= 1.0
    for step in (1, 2, 3):
        assert 0.0 <= m[step]["spin/generated_equals_target"] <= 1.0
        assert math.isfinite(m[step]["actor/grad_norm"]) and m[step]["actor/grad_norm"] > 0
    # steps 1 and 3 start from a reference equal to the policy (initial model; refreshed at step 2 -> 3)
    for step in (1, 3):
        assert abs(m[step]["train/rewards/chosen"]) < 1e-4 and abs(m[step]["train/rewards/rejected"]) < 1e-4, step
        assert m[step]["actor/dpo_loss"] == pytest.approx(math.log(2), abs=1e-4)
    assert m[2]["train/rewards/margins"] > 1e-3  # one step on the data moved the policy towards the targets
    assert log.count("the reference policy is now the current policy") == 1


def test_sppo_trains_on_win_probabilities(assets, tmp_path):
    args = _common(assets, tmp_path / "ckpt", 2) + ["actor_rollout_ref.rollout.n=4", "actor_rollout_ref.actor.sppo_eta=2.0",
                                                     "sppo.micro_batch_size_per_gpu=16",
                                                     "+reward_model.reward_kwargs.format_score=0.5"]
    m, _ = run_recipe("recipe.sppo.main_sppo", tmp_path / "sppo", args)
    assert sorted(m) == [0, 1, 2] and "val-core/arithmetic/reward/mean@1" in m[2]
    for step in (1, 2):
        assert m[step]["sppo/decisive_prompts"] > 0 and math.isfinite(m[step]["sppo/loss"])
        # the reference is the sampling policy: log-ratios start at 0, so the loss is eta^2 E[(P - 1/2)^2] > 0
        assert abs(m[step]["sppo/log_ratio"]) < 1e-4 and m[step]["sppo/loss"] > 0
        assert m[step]["actor/grad_norm"] > 0
