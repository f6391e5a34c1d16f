"""`recipe.dpo.main_dpo` with ``dpo.loss_type=kto`` end to end (Ray workers, FSDP2, greedy generation for
validation) on the tiny model and the embedded unpaired arithmetic preferences.

The config is composed from ``recipe/dpo/config`` with the README command's overrides and driven in this
process the way ``main_dpo`` drives it (one Ray start and one worker group keep the test within its CI budget):
4 steps with checkpoints at steps 2 and 4; then a second trainer on the same workers resumes from the step-2
checkpoint (weights, optimizer and driver state read back from disk) and must log the same step-3/4 metrics.
Held-out desirable completions must end up with a larger implicit reward than the undesirable ones of the same
prompt more often than not (every reward is exactly 0 before the first step).
"""

import math
import shutil
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from recipe.dpo.dpo_trainer import DPOTrainer
from verl.utils.embedded import load_tokenizer

pytestmark = pytest.mark.e2e

CONFIG_DIR = str(Path(__file__).resolve().parents[2] / "recipe" / "dpo" / "config")


def _config(model, files, ckpt):
    overrides = [f"data.train_files={files['kto_train']}", f"data.val_files={files['kto_test']}",
                 f"actor_rollout_ref.model.path={model}", "dpo.loss_type=kto", "dpo.beta=0.5",
                 "data.train_batch_size=8", "dpo.micro_batch_size_per_gpu=4", "actor_rollout_ref.actor.optim.lr=3e-3",
                 "trainer.total_training_steps=4", "trainer.test_freq=4", "trainer.save_freq=2",
                 f"trainer.default_local_dir={ckpt}", "trainer.logger=[console]"]
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        cfg = compose("dpo_trainer", overrides=overrides)
    OmegaConf.resolve(cfg)
    return cfg


def _by_step(trainer):
    return {m["step"]: m for m in trainer.metric_history}



def test_kto_trains_checkpoints_and_resumes(env, arith_rl_assets, arith_pref_files, tmp_path):
    model, ckpt = arith_rl_assets["model"], tmp_path / "ckpt"
    tokenizer = load_tokenizer()
    first = DPOTrainer(_config(model, arith_pref_files, ckpt), tokenizer)
    first.init_workers()
    first.fit()
    full = _by_step(first)
    # before training the policy is the reference up to float rounding (on AMX hosts oneDNN's kernels differ with
    # the batch shape by ~1e-7, so "chosen > rejected" of two ~0 rewards is a coin flip): margins ~0
    assert abs(full[0]["val/rewards/margins"]) <= 1e-4, full[0]
    assert full[0]["val/loss"] == pytest.approx(0.5, abs=1e-6)  # r = z = 0: each loss is 1 - sigmoid(0)
    for step in (1, 2, 3, 4):
        for key in ("train/rewards/chosen", "train/rewards/rejected", "train/logps/chosen", "train/logps/rejected",
                    "train/kl", "actor/kto_loss", "actor/grad_norm"):
            assert math.isfinite(full[step][key]), (step, key)
        assert full[step]["train/kl"] >= 0.0
    assert full[2]["train/kl"] > 0.0  # the policy moved away from the reference: the reference point is active
    assert full[4]["val/rewards/accuracies"] > 0.5
    assert 0.0 <= full[4]["val/greedy_accuracy"] <= 1.0
    assert (ckpt / "global_step_2" / "actor").is_dir() and (ckpt / "huggingface" / "config.json").exists()

    resumed_dir = tmp_path / "resume_ckpt"
    shutil.copytree(ckpt / "global_step_2", resumed_dir / "global_step_2")
    (resumed_dir / "latest_checkpointed_iteration.txt").write_text("2")
    second = DPOTrainer(_config(model, arith_pref_files, resumed_dir), tokenizer)
    second.policy = first.policy  # the same workers, now holding step-4 weights until the checkpoint loads
    second.groups = {"actor": first.policy}
    second.fit()
    resumed = _by_step(second)
    assert sorted(s for s in resumed if s > 2) == [3, 4]
    for step in (3, 4):
        for key in ("actor/kto_loss", "actor/grad_norm", "train/kl", "train/rewards/chosen", "train/rewards/rejected"):
            assert resumed[step][key] == pytest.approx(full[step][key], rel=1e-4, abs=1e-6), (step, key)
    for key in ("val/loss", "val/rewards/margins", "val/rewards/accuracies"):
        assert resumed[4][key] == pytest.approx(full[4][key], rel=1e-4, abs=1e-6), key
