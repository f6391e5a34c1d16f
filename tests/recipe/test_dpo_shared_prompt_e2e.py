"""Offline DPO with ``dpo.share_prompt_prefix`` (the default) on real Ray workers and FSDP2: the worker group reports
packed pairs as supported, packed and two-row reference / policy log-probs agree, and two training steps with
reference log-probs every step start at the DPO loss log 2 (policy == reference) and stay finite.

The config is composed from ``recipe/dpo/config`` and driven in this process the way ``main_dpo`` drives it (one
interpreter start keeps the test within its CI budget); model and pairs are the session fixtures of
``tests/recipe/conftest.py``.
"""

import math
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from recipe.dpo.dpo_trainer import DPOTrainer
from verl.utils.embedded import load_tokenizer

pytestmark = pytest.mark.e2e

CONFIG_DIR = str(Path(__file__).resolve().parents[2] / "recipe" / "dpo" / "config")



def test_packed_pairs_match_two_rows_and_train(env, arith_rl_assets, arith_pref_files, tmp_path, capsys):
    overrides = [f"data.train_files={arith_pref_files['train']}", f"data.val_files={arith_pref_files['test']}",
                 f"actor_rollout_ref.model.path={arith_rl_assets['model']}", "data.train_batch_size=8",
                 "dpo.micro_batch_size_per_gpu=4", "dpo.beta=0.5", "dpo.precompute_ref_log_probs=false",
                 "dpo.greedy_eval=false", "actor_rollout_ref.actor.optim.lr=3e-3", "trainer.total_training_steps=2",
                 "trainer.test_freq=2", "trainer.val_before_train=false", "trainer.save_freq=-1",
                 f"trainer.default_local_dir={tmp_path / 'ckpt'}", "trainer.logger=[console]"]
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        cfg = compose("dpo_trainer", overrides=overrides)
    OmegaConf.resolve(cfg)
    trainer = DPOTrainer(cfg, load_tokenizer())
    trainer.init_workers()
    assert "each pair runs as one packed [prompt | chosen | rejected] sequence" in capsys.readouterr().out
    assert trainer.share_prompt and trainer.spec.shared_prompt

    for method, key in (("compute_ref_seq_logps", "ref_logps"), ("compute_seq_logps", "logps")):
        values = {}
        for shared in (True, False):
            data = trainer.train.pairs(range(len(trainer.train)))
            data.meta_info.update(share_prompt=shared, average=False)
            values[shared] = trainer.call(trainer.policy, method, data).batch[key]
        assert values[True].shape == (2 * len(trainer.train),) and torch.isfinite(values[True]).all()
        torch.testing.assert_close(values[True], values[False], rtol=0, atol=1e-5)

    trainer.fit()
    metrics = {m["step"]: m for m in trainer.metric_history}
    assert metrics[1]["actor/dpo_loss"] == pytest.approx(math.log(2), abs=1e-5)  # policy == reference at step 1
    for step in (1, 2):
        for key in ("actor/dpo_loss", "actor/grad_norm", "train/rewards/margins", "train/logps/chosen"):
            assert math.isfinite(metrics[step][key]), (step, key)
    assert metrics[2]["actor/dpo_loss"] != metrics[1]["actor/dpo_loss"]
    assert math.isfinite(metrics[2]["val/loss"]) and "val/rewards/accuracies" in metrics[2]
