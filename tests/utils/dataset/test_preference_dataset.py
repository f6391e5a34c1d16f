"""PreferenceDataset / UnpairedPreferenceDataset: layout, chat-list responses and every bad-input error."""

import logging

import pandas as pd
import pytest
import torch
from omegaconf import OmegaConf

from verl.trainer.config_schema.spec import specs
from verl.trainer.preference.dataset import (PreferenceDataError, PreferenceDataset, ResponseDataset,
                                                   UnpairedPreferenceDataset)
from verl.utils.config import ConfigError
from verl.utils.embedded import load_tokenizer
from verl.utils.embedded.preferences import make_kto_rows, make_preference_rows, write_preference_files
from verl.workers.config.data import PreferenceDataConfig

CFG = OmegaConf.create({"max_prompt_length": 24, "max_response_length": 6})


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer()


def _write(tmp_path, rows, name="p.parquet"):
    path = tmp_path / name
    pd.DataFrame(rows).to_parquet(path)
    return str(path)


def test_pairs_are_interleaved_in_the_rollout_layout(tmp_path, tok):
    chat = _write(tmp_path, [{"prompt": [{"role": "user", "content": "1+2="}], "chosen": "3", "rejected": "4"}])
    plain = _write(tmp_path, [{"prompt": "5-1=", "chosen": "4", "rejected": "14"}], "plain.parquet")
    ds = PreferenceDataset([chat, plain], tok, CFG)
    pairs = ds.pairs([0, 1])
    b = pairs.batch
    assert b["input_ids"].shape == (4, 30) and b["responses"].shape == (4, 6)
    torch.testing.assert_close(b["responses"], b["input_ids"][:, -6:])
    eos = tok.eos_token_id
    texts = [tok.decode(r[m.bool()]) for r, m in zip(b["responses"], b["response_mask"])]
    assert texts == ["3" + tok.eos_token, "4" + tok.eos_token, "4" + tok.eos_token, "14" + tok.eos_token]
    assert int(b["responses"][3][b["response_mask"][3].bool()][-1]) == eos
    # a string prompt is one user turn: same prompt tokens as the chat form
    prompt = tok.apply_chat_template([{"role": "user", "content": "5-1="}], add_generation_prompt=True, tokenize=False)
    p_ids = b["input_ids"][2, :24][b["attention_mask"][2, :24].bool()].tolist()
    assert tok.decode(p_ids) == prompt
    # left-padded prompt, right-padded response, positions count valid tokens only
    assert b["attention_mask"][0, 0] == 0 and b["attention_mask"][0, 23] == 1
    assert b["position_ids"][0, 23] == b["attention_mask"][0, :24].sum() - 1
    assert ds.chosen_texts([1]) == ["4"]


def test_chat_list_responses_match_the_template(tmp_path, tok):
    rows = [{"prompt": [{"role": "user", "content": "2+2="}],
             "chosen": [{"role": "assistant", "content": "4"}], "rejected": [{"role": "assistant", "content": "5"}]}]
    ds = PreferenceDataset(_write(tmp_path, rows), tok, OmegaConf.create({"max_prompt_length": 24,
                                                                          "max_response_length": 8}))
    b = ds.pairs([0]).batch
    text = tok.decode(b["responses"][0][b["response_mask"][0].bool()])
    assert text.startswith("4" + tok.eos_token)


@pytest.mark.parametrize("row, message", [
    ({"prompt": "1+1=", "chosen": "", "rejected": "3"}, "'chosen' is empty"),
    ({"prompt": "1+1=", "chosen": "2", "rejected": None}, "'rejected' is missing or empty"),
    ({"prompt": "1+1=", "chosen": "2", "rejected": "2"}, "are the same response"),
    ({"prompt": "1+1=", "chosen": "2222222222", "rejected": "3"}, "data.max_response_length=6"),
    ({"prompt": "1+1=" * 9, "chosen": "2", "rejected": "3"}, "data.max_prompt_length=24"),
])
def test_bad_rows_are_clear_errors_naming_the_row(tmp_path, tok, row, message):
    good = {"prompt": "2+2=", "chosen": "4", "rejected": "5"}
    path = _write(tmp_path, [good, row])
    with pytest.raises(PreferenceDataError, match=message) as err:
        PreferenceDataset(path, tok, CFG)
    assert "row 1" in str(err.value) and path in str(err.value)


def test_missing_column_names_the_file_and_columns(tmp_path, tok):
    path = _write(tmp_path, [{"prompt": "1+1=", "chosen": "2"}])
    with pytest.raises(PreferenceDataError, match=r"missing column\(s\) \['rejected'\]"):
        PreferenceDataset(path, tok, CFG)


def test_overlong_prompts_are_skipped_counted_and_logged_when_filtering(tmp_path, tok, caplog):
    rows = [{"prompt": "2+2=", "chosen": "4", "rejected": "5"}, {"prompt": "9" * 40, "chosen": "1", "rejected": "2"},
            {"prompt": "3+3=", "chosen": "6", "rejected": "7"}]
    cfg = OmegaConf.merge(CFG, {"filter_overlong_prompts": True})
    with caplog.at_level(logging.WARNING):
        ds = PreferenceDataset(_write(tmp_path, rows), tok, cfg)
    assert len(ds) == 2 and ds.num_filtered == 1
    assert "skipped 1 row(s)" in caplog.text
    assert ds.chosen_texts([0, 1]) == ["4", "6"]


def test_truncation_right_cuts_long_responses(tmp_path, tok):
    rows = [{"prompt": "2+2=", "chosen": "4444444444", "rejected": "5"}]
    ds = PreferenceDataset(_write(tmp_path, rows), tok, OmegaConf.merge(CFG, {"truncation": "right"}))
    assert ds.pairs([0]).batch["response_mask"][0].sum() == 6


def test_kto_rows_and_labels(tmp_path, tok):
    pairs = make_preference_rows(4, seed=0)
    ds = UnpairedPreferenceDataset(_write(tmp_path, make_kto_rows(pairs)), tok, OmegaConf.create(
        {"max_prompt_length": 32, "max_response_length": 6}))
    b = ds.batch(range(8)).batch
    assert b["label"].tolist() == [1.0, 0.0] * 4
    bad = _write(tmp_path, [{"prompt": "1+1=", "completion": "2", "label": "maybe"}], "bad.parquet")
    with pytest.raises(PreferenceDataError, match="'label' must be true/false"):
        UnpairedPreferenceDataset(bad, tok, CFG)


def test_embedded_files_hold_out_test_expressions(tmp_path):
    paths = write_preference_files(str(tmp_path / "d"), n_train=60, n_test=20)
    train, test = pd.read_parquet(paths["train"]), pd.read_parquet(paths["test"])
    exprs = lambda df: {e["expression"] for e in df["extra_info"]}  # noqa: E731
    assert not exprs(train) & exprs(test) and len(exprs(train)) == 60
    assert all(c != r for c, r in zip(train["chosen"], train["rejected"]))
    assert all(int(c) == int(gt["ground_truth"]) for c, gt in zip(test["chosen"], test["reward_model"]))


def test_kto_mismatched_partners_have_another_prompt():
    from verl.trainer.preference.dataset import mismatched_partners

    prompts = ["a", "a", "b", "b", "c"]
    partners = mismatched_partners(prompts)
    assert partners == [4, 4, 1, 1, 3]
    assert all(prompts[j] != prompts[i] for i, j in enumerate(partners))
    with pytest.raises(PreferenceDataError, match="needs >= 2 prompts"):
        mismatched_partners(["a", "a"])


def test_kto_pairs_layout_and_one_label_files_are_refused(tmp_path, tok):
    pairs = make_preference_rows(3, seed=0)
    cfg = OmegaConf.create({"max_prompt_length": 32, "max_response_length": 6})
    ds = UnpairedPreferenceDataset(_write(tmp_path, make_kto_rows(pairs)), tok, cfg)
    rows = ds.pairs([2, 3]).batch
    assert rows["label"].tolist() == [1.0, 1.0, 0.0, 0.0]
    # row 2 is prompt 1 with its own completion; its mismatched row is prompt 1 with row 1's completion
    assert torch.equal(rows["input_ids"][0, :32], rows["input_ids"][1, :32])
    assert torch.equal(rows["responses"][1], ds.batch([1]).batch["responses"][0])
    assert not torch.equal(rows["responses"][0], rows["responses"][1])
    good_only = [r for r in make_kto_rows(pairs) if r["label"]]
    with pytest.raises(PreferenceDataError, match="every row has 'label' = true"):
        UnpairedPreferenceDataset(_write(tmp_path, good_only, "good.parquet"), tok, cfg)


def test_partial_config_takes_the_schema_defaults_and_bad_values_name_the_key(tmp_path, tok):
    """The column names and lengths a config leaves out are the schema's (the recipes' yamls extend
    ppo_trainer.yaml's data section with the preference columns); a bad value is refused naming the key."""
    schema = specs(PreferenceDataConfig)
    path = _write(tmp_path, [{"prompt": "2+2=", "chosen": "4", "rejected": "5", "response": "4"}])
    ds = PreferenceDataset(path, tok, {})
    assert ds.keys == {"prompt": schema["prompt_key"].default, "chosen": schema["chosen_key"].default,
                       "rejected": schema["rejected_key"].default}
    assert (ds.enc.max_prompt_length, ds.enc.max_response_length) == (schema["max_prompt_length"].default,
                                                                      schema["max_response_length"].default)
    assert ds.enc.use_chat_template is schema["apply_chat_template"].default
    assert ResponseDataset(path, tok, None).keys["response"] == schema["response_key"].default
    assert len(PreferenceDataset(path, tok, {"val_files": None})) == 1  # the recipes run without a validation set
    with pytest.raises(ConfigError, match=r"data\.max_response_length=0 must be an integer >= 1"):
        PreferenceDataset(path, tok, {"max_response_length": 0})
    with pytest.raises(ConfigError, match=r"data\.apply_chat_template='no' must be true or false"):
        PreferenceDataset(path, tok, {"apply_chat_template": "no"})
    with pytest.raises(ValueError, match=r"preference responses support error\|right"):  # narrower than RL's choices
        PreferenceDataset(path, tok, {"truncation": "left"})
