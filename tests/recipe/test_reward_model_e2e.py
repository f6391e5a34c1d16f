"""`recipe.reward_model.main_reward_model` end to end on the tiny model (CPU, Ray workers, FSDP2): Bradley-Terry
training logs pair accuracy, checkpoints, and writes a sequence classifier that verl's reward-model loader
(the one main_ppo's reward_model.enable=True uses) scores with.

The config is composed from ``recipe/reward_model/config`` with the README command's overrides and driven in this
process the way ``main_reward_model`` drives it (no second interpreter start: keeps the test within its CI
budget). The model and the preference pairs are the session fixtures of ``tests/recipe/conftest.py``.
"""

import math
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from recipe.reward_model.rm_trainer import RewardModelTrainer
from verl.utils.embedded import load_tokenizer

pytestmark = pytest.mark.e2e

CONFIG_DIR = str(Path(__file__).resolve().parents[2] / "recipe" / "reward_model" / "config")
STEPS = 2



def test_reward_model_training_writes_a_loadable_classifier(env, arith_rl_assets, arith_pref_files, tmp_path):
    ckpt = tmp_path / "ckpt"
    overrides = [f"data.train_files={arith_pref_files['train']}", f"data.val_files={arith_pref_files['test']}",
                 f"actor_rollout_ref.model.path={arith_rl_assets['model']}", "data.train_batch_size=8",
                 "reward_model_training.micro_batch_size_per_gpu=4", "actor_rollout_ref.actor.optim.lr=1e-3",
                 f"trainer.total_training_steps={STEPS}", f"trainer.test_freq={STEPS}",
                 f"trainer.save_freq={STEPS}", f"trainer.default_local_dir={ckpt}", "trainer.logger=[console]"]
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        cfg = compose("reward_model_trainer", overrides=overrides)
    OmegaConf.resolve(cfg)
    trainer = RewardModelTrainer(cfg, load_tokenizer())
    trainer.init_workers()
    trainer.fit()
    metrics = {m["step"]: m for m in trainer.metric_history}

    assert 0.0 <= metrics[0]["val/rm/accuracy"] <= 1.0
    for step in range(1, STEPS + 1):
        assert math.isfinite(metrics[step]["train/rm/loss"]) and math.isfinite(metrics[step]["train/rm/grad_norm"])
    assert metrics[STEPS]["val/rm/loss"] != metrics[0]["val/rm/loss"]
    assert (ckpt / f"global_step_{STEPS}" / "reward_model").is_dir()

    from verl.utils.model import load_reward_model

    model = load_reward_model(str(ckpt / "huggingface")).eval()
    assert type(model).__name__.endswith("ForSequenceClassification") and model.config.num_labels == 1
    with torch.no_grad():
        out = model(input_ids=torch.tensor([[5, 6, 7, 8]])).logits
    assert out.shape == (1, 1) and torch.isfinite(out).all()
