"""`python -m recipe.dpo.main_dpo` end to end on the tiny model and embedded arithmetic preferences (CPU, Ray).

One run trains 4 steps with checkpoints at steps 2 and 4; a second run resumes from step 2 and must log the
same step-3/4 metrics. Bad configs exit with code 2 before any worker starts and write nothing.
"""

import math
import shutil

import pytest

from ray_nodes import ray_was_used
from recipe_runs import run_recipe  # tests/recipe is on sys.path (pytest rootdir-less import mode)

pytestmark = pytest.mark.e2e

MODULE = "recipe.dpo.main_dpo"


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    from verl.utils.embedded import make_model_dir
    from verl.utils.embedded.arithmetic import ArithmeticConfig
    from verl.utils.embedded.preferences import write_preference_files

    root = tmp_path_factory.mktemp("dpo_assets")
    paths = write_preference_files(str(root / "data"), n_train=32, n_test=16, config=ArithmeticConfig(max_digits=1))
    return {"model": make_model_dir(str(root / "model"), size="tiny", seed=0), **paths}


def _args(a, ckpt, steps=4):
    return [f"data.train_files={a['train']}", f"data.val_files={a['test']}", f"actor_rollout_ref.model.path={a['model']}",
            "data.train_batch_size=8", "dpo.micro_batch_size_per_gpu=4", "dpo.beta=0.5",
            "actor_rollout_ref.actor.optim.lr=3e-3", f"trainer.total_training_steps={steps}", "trainer.test_freq=4",
            "trainer.save_freq=2", f"trainer.default_local_dir={ckpt}", "trainer.logger=[console,file]"]


def test_dpo_trains_checkpoints_and_resumes(assets, tmp_path):
    ckpt = tmp_path / "ckpt"
    full, log = run_recipe(MODULE, tmp_path / "full", _args(assets, ckpt))
    assert full[0]["val/rewards/accuracies"] == 0.0 and full[0]["val/loss"] == pytest.approx(math.log(2), abs=1e-5)
    for step in (1, 2, 3, 4):
        for key in ("train/rewards/accuracies", "train/rewards/margins", "train/logps/chosen", "train/logps/rejected",
                    "train/rewards/chosen", "train/rewards/rejected", "actor/dpo_loss", "actor/grad_norm"):
            assert math.isfinite(full[step][key]), (step, key)
    # the policy moved towards the chosen answers on held-out pairs (both start at exactly 0)
    assert full[4]["val/rewards/margins"] > 0 and full[4]["val/rewards/accuracies"] > 0
    assert 0.0 <= full[4]["val/greedy_accuracy"] <= 1.0
    assert (ckpt / "global_step_2" / "actor").is_dir() and (ckpt / "huggingface" / "config.json").exists()

    resumed_dir = tmp_path / "resume_ckpt"
    shutil.copytree(ckpt / "global_step_2", resumed_dir / "global_step_2")
    (resumed_dir / "latest_checkpointed_iteration.txt").write_text("2")
    resumed, _ = run_recipe(MODULE, tmp_path / "resumed", _args(assets, resumed_dir))
    assert min(resumed) == 3 and max(resumed) == 4
    for step in (3, 4):
        for key in ("train/rewards/margins", "actor/dpo_loss", "val/loss"):
            if key in full[step]:
                assert resumed[step][key] == pytest.approx(full[step][key], rel=1e-4, abs=1e-6), (step, key)


@pytest.mark.parametrize("override, message", [
    ("dpo.loss_type=robust", "loss_type='robust' is not a pairwise preference loss"),
    ("actor_rollout_ref.actor.use_dynamic_bsz=true", "use_dynamic_bsz=False"),
    ("data.max_prompt_length=8", "data.max_prompt_length=8"),
])
def test_bad_config_exits_2_before_workers_and_writes_nothing(assets, tmp_path, override, message):
    ckpt = tmp_path / "ckpt"
    _, log = run_recipe(MODULE, tmp_path / "run", _args(assets, ckpt) + [override], expect_rc=2)
    assert "Config error" in log and message in log
    assert not ckpt.exists() and not ray_was_used(log)
