"""`python -m recipe.reward_model.main_reward_model` end to end on the tiny model (CPU, Ray): Bradley-Terry
training logs pair accuracy, checkpoints, and writes a sequence classifier that verl's reward-model loader
(the one main_ppo's reward_model.enable=True uses) scores with."""

import math

import pytest
import torch

from recipe_runs import run_recipe  # tests/recipe is on sys.path (pytest rootdir-less import mode)

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    from verl.utils.embedded import make_model_dir
    from verl.utils.embedded.arithmetic import ArithmeticConfig
    from verl.utils.embedded.preferences import write_preference_files

    root = tmp_path_factory.mktemp("rm_assets")
    paths = write_preference_files(str(root / "data"), n_train=32, n_test=16, config=ArithmeticConfig(max_digits=1))
    return {"model": make_model_dir(str(root / "model"), size="tiny", seed=0), **paths}


def test_reward_model_training_writes_a_loadable_classifier(assets, tmp_path):
    ckpt = tmp_path / "ckpt"
    args = [f"data.train_files={assets['train']}", f"data.val_files={assets['test']}",
            f"actor_rollout_ref.model.path={assets['model']}", "data.train_batch_size=8",
            "reward_model_training.micro_batch_size_per_gpu=4", "actor_rollout_ref.actor.optim.lr=1e-3",
            "trainer.total_training_steps=4", "trainer.test_freq=4", "trainer.save_freq=4",
            f"trainer.default_local_dir={ckpt}", "trainer.logger=[console,file]"]
    metrics, _ = run_recipe("recipe.reward_model.main_reward_model", tmp_path / "run", args)
    assert 0.0 <= metrics[0]["val/rm/accuracy"] <= 1.0
    for step in (1, 2, 3, 4):
        assert math.isfinite(metrics[step]["train/rm/loss"]) and math.isfinite(metrics[step]["train/rm/grad_norm"])
    assert metrics[4]["val/rm/loss"] != metrics[0]["val/rm/loss"]
    assert (ckpt / "global_step_4" / "reward_model").is_dir()

    from verl.utils.model import load_reward_model

    model = load_reward_model(str(ckpt / "huggingface")).eval()
    assert type(model).__name__.endswith("ForSequenceClassification") and model.config.num_labels == 1
    with torch.no_grad():
        out = model(input_ids=torch.tensor([[5, 6, 7, 8]])).logits
    assert out.shape == (1, 1) and torch.isfinite(out).all()
