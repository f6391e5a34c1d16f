"""The offline DPO driver's choice of packed pairs (``dpo.share_prompt_prefix``): on by default for pairwise
losses when the workers support it; off with one log line when they do not, for KTO, or when the key is false."""

from pathlib import Path
from types import SimpleNamespace

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from recipe.dpo.dpo_trainer import DPOTrainer
from verl.utils.embedded import load_tokenizer

CONFIG_DIR = str(Path(__file__).resolve().parents[2] / "recipe" / "dpo" / "config")


def _trainer(files, *overrides, support=None):
    args = [f"data.train_files={files['train']}", f"data.val_files={files['test']}", "data.train_batch_size=8",
            "dpo.micro_batch_size_per_gpu=4", *overrides]
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        cfg = compose("dpo_trainer", overrides=args)
    OmegaConf.resolve(cfg)
    trainer = DPOTrainer(cfg, load_tokenizer())
    calls = []
    trainer.policy = SimpleNamespace(shared_prompt_support=lambda: calls.append(1) or [support])
    return trainer, calls


def test_packed_pairs_by_default_when_supported(arith_pref_files, capsys):
    trainer, _ = _trainer(arith_pref_files)
    assert trainer._shared_prompt_decision() is True
    assert "one packed [prompt | chosen | rejected] sequence" in capsys.readouterr().out


def test_unsupported_model_falls_back_with_the_reason(arith_pref_files, capsys):
    reason = "attention implementation 'flash_attention_2' does not take a dense 4-D mask (sdpa and eager do)"
    trainer, _ = _trainer(arith_pref_files, support=reason)
    assert trainer._shared_prompt_decision() is False
    out = capsys.readouterr().out
    assert f"dpo.share_prompt_prefix: {reason}; computing chosen and rejected as separate rows" in out


@pytest.mark.parametrize("overrides, message", [
    (["dpo.share_prompt_prefix=false"], None),
    (["dpo.loss_type=kto", "data.train_files=KTO_TRAIN", "data.val_files=KTO_TEST"], "KTO rows are unpaired"),
])
def test_key_off_and_kto_keep_two_rows_without_asking_the_workers(arith_pref_files, capsys, overrides, message):
    overrides = [o.replace("KTO_TRAIN", arith_pref_files["kto_train"]).replace("KTO_TEST", arith_pref_files["kto_test"])
                 for o in overrides]
    trainer, calls = _trainer(arith_pref_files, *overrides)
    assert trainer._shared_prompt_decision() is False and calls == []
    out = capsys.readouterr().out
    assert (message in out) if message else "share_prompt_prefix" not in out


def test_a_non_boolean_key_is_a_config_error(arith_pref_files):
    from verl.utils.config import ConfigError

    with pytest.raises(ConfigError, match="dpo.share_prompt_prefix='yes please': set true"):
        _trainer(arith_pref_files, "dpo.share_prompt_prefix='yes please'")
