"""KTO in the offline DPO recipe, pure parts: loss selection and its errors, the desirable/undesirable weight
advice, and data errors raised by the trainer's constructor (before any worker starts)."""

import re
from pathlib import Path

import pandas as pd
import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from recipe.dpo.dpo_trainer import DPOTrainer, build_loss, kto_weight_warning
from verl.trainer.preference import KTOLoss, PairwisePreferenceLoss
from verl.trainer.preference.dataset import PreferenceDataError
from verl.utils.config import ConfigError
from verl.utils.embedded import load_tokenizer
from verl.utils.embedded.arithmetic import ArithmeticConfig
from verl.utils.embedded.preferences import write_preference_files

CONFIG_DIR = str(Path(__file__).resolve().parents[2] / "recipe" / "dpo" / "config")


def _dpo(**section):
    return OmegaConf.create({"loss_type": "sigmoid", "beta": 0.1, "label_smoothing": 0.0, **section})


def test_build_loss_picks_kto_with_trl_weight_names_and_defaults():
    loss = build_loss(_dpo(loss_type="kto", beta=0.3))
    assert loss == KTOLoss(0.3, 1.0, 1.0)
    assert build_loss(_dpo(loss_type="kto", desirable_weight=1.5, undesirable_weight=0.5)) == KTOLoss(0.1, 1.5, 0.5)
    assert isinstance(build_loss(_dpo(loss_type="ipo")), PairwisePreferenceLoss)


@pytest.mark.parametrize("section, message", [
    ({"loss_type": "robust"}, "choose one of sigmoid, ipo, hinge (paired prompt/chosen/rejected rows) or kto"),
    ({"loss_type": "kto", "label_smoothing": 0.1}, "set dpo.label_smoothing=0 with kto"),
    ({"loss_type": "kto", "undesirable_weight": -1.0}, "undesirable_weight must be > 0"),
])
def test_build_loss_errors_name_the_key(section, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        build_loss(_dpo(**section))


def test_kto_weight_advice():
    assert kto_weight_warning(100, 100, 1.0, 1.0) is None
    assert kto_weight_warning(100, 300, 3.5, 1.0) is None  # 350 / 300 is within [1, 4/3]
    message = kto_weight_warning(100, 300, 1.0, 1.0)
    assert "ratio of 0.33" in message and "between 3.00 and 4.00" in message


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("kto_files")
    paths = write_preference_files(str(root), n_train=16, n_test=8, config=ArithmeticConfig(max_digits=1))
    kto = pd.read_parquet(paths["kto_train"])
    kto[kto["label"]].to_parquet(root / "good_only.parquet")
    kto.drop(columns=["label"]).to_parquet(root / "no_label.parquet")
    return {**paths, "good_only": str(root / "good_only.parquet"), "no_label": str(root / "no_label.parquet")}


def _trainer(files, *overrides):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        cfg = compose("dpo_trainer", overrides=[f"data.train_files={files['kto_train']}",
                                               f"data.val_files={files['kto_test']}", "dpo.loss_type=kto",
                                               "data.train_batch_size=8", "trainer.device=cpu", *overrides])
    OmegaConf.resolve(cfg)
    return DPOTrainer(cfg, load_tokenizer())


def test_trainer_loads_unpaired_files_for_kto(files):
    trainer = _trainer(files)
    assert isinstance(trainer.loss, KTOLoss) and trainer.kto
    assert len(trainer.train) == 32 and sum(trainer.train.labels) == 16
    rows, idx = trainer.next_pairs()
    assert len(rows) == 16 and rows.batch["label"][0::2].tolist() == [trainer.train.labels[i] for i in idx]
    # the paired loss types still read the pairs
    paired = _trainer(files, "dpo.loss_type=sigmoid", f"data.train_files={files['train']}",
                      f"data.val_files={files['test']}")
    assert isinstance(paired.loss, PairwisePreferenceLoss) and not paired.kto and len(paired.train) == 16


@pytest.mark.parametrize("overrides, message", [
    (["data.train_files={good_only}"], "every row has 'label' = true (desirable); KTO needs both"),
    (["data.train_files={no_label}"], "missing column(s) ['label']"),
    (["data.train_files={train}"], "missing column(s) ['completion', 'label']"),
    (["data.train_files={train}"], "dpo.loss_type=kto reads unpaired rows (prompt, completion, label)"),
    (["dpo.loss_type=sigmoid"], "unpaired rows (prompt, completion, label) take dpo.loss_type=kto"),
])
def test_trainer_data_errors_name_the_column_and_the_fix(files, overrides, message):
    with pytest.raises(PreferenceDataError, match=re.escape(message)):
        _trainer(files, *[o.format(**files) for o in overrides])
