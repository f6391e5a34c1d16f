"""SFTDataset and MultiTurnSFTDataset: layout, loss masks on response/assistant tokens only, truncation."""

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from omegaconf import OmegaConf

from verl.trainer.config_schema.spec import specs
from verl.utils.config import ConfigError
from verl.utils.dataset import MultiTurnSFTDataset, SFTDataset
from verl.utils.embedded import load_tokenizer
from verl.utils.embedded.arithmetic import make_sft_rows
from verl.workers.config.data import SFTDataConfig


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer()


def write(path, rows):
    pq.write_table(pa.Table.from_pylist(rows), str(path))
    return str(path)


def sft_cfg(**kw):
    base = dict(
        prompt_key="prompt",
        response_key="response",
        prompt_dict_keys=None,
        response_dict_keys=None,
        max_length=48,
        truncation="error",
        chat_template=None,
        multiturn={"messages_key": "messages"},
    )
    base.update(kw)
    return OmegaConf.create(base)


def trained_text(tok, item):
    ids, mask = item["input_ids"], item["loss_mask"].bool()
    return tok.decode(ids[mask])


def test_single_turn_layout_and_mask(tok, tmp_path):
    f = write(tmp_path / "sft.parquet", make_sft_rows(4, seed=0))
    ds = SFTDataset(f, tok, sft_cfg())
    row = make_sft_rows(4, seed=0)[2]
    item = ds[2]
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": row["prompt"]}], add_generation_prompt=True, tokenize=False
    )
    expect = tok.encode(prompt + row["response"] + "<|im_end|>", add_special_tokens=False)
    n = len(expect)
    assert set(item) == {"input_ids", "attention_mask", "position_ids", "loss_mask"}
    assert all(v.shape == (48,) and v.dtype == torch.long for v in item.values())
    assert item["input_ids"][:n].tolist() == expect and (item["input_ids"][n:] == tok.pad_token_id).all()
    assert item["attention_mask"].tolist() == [1] * n + [0] * (48 - n)
    assert item["position_ids"][:n].tolist() == list(range(n))
    assert trained_text(tok, item) == row["response"] + "<|im_end|>"  # the answer and eos, nothing else
    first = n - len(row["response"]) - 1
    assert (
        item["loss_mask"][:first].sum() == 0 and item["loss_mask"][first:n].all() and item["loss_mask"][n:].sum() == 0
    )


def test_single_turn_dict_keys_and_truncation(tok, tmp_path):
    rows = [{"q": {"text": "9*9="}, "a": {"value": "81"}}]
    f = write(tmp_path / "nested.parquet", rows)
    c = sft_cfg(prompt_key="q", response_key="a", prompt_dict_keys=["text"], response_dict_keys=["value"])
    full = SFTDataset(f, tok, c)[0]
    n = int(full["attention_mask"].sum())
    assert trained_text(tok, full) == "81<|im_end|>"
    with pytest.raises(ValueError) as err:
        SFTDataset(f, tok, OmegaConf.merge(c, {"max_length": 10}))[0]
    assert "row 0 of" in str(err.value) and "nested.parquet" in str(err.value)
    assert "data.truncation=left|right" in str(err.value)
    left = SFTDataset(f, tok, OmegaConf.merge(c, {"max_length": 10, "truncation": "left"}))[0]
    assert left["input_ids"].tolist() == full["input_ids"][n - 10 : n].tolist()
    assert trained_text(tok, left) == "81<|im_end|>"
    right = SFTDataset(f, tok, OmegaConf.merge(c, {"max_length": 10, "truncation": "right"}))[0]
    assert right["input_ids"].tolist() == full["input_ids"][:10].tolist() and right["loss_mask"].sum() == 0
    with pytest.raises(KeyError, match="data.response_key"):
        SFTDataset(f, tok, sft_cfg(prompt_key="q", response_key="answer"))
    with pytest.raises(ValueError, match="data.truncation='middle'"):
        SFTDataset(f, tok, OmegaConf.merge(c, {"truncation": "middle"}))


def test_multiturn_loss_mask_on_assistant_tokens_only(tok, tmp_path):
    conv = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "2+2="},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "and 3+3?"},
        {"role": "assistant", "content": "6, done"},
    ]
    f = write(tmp_path / "mt.parquet", [{"messages": conv}])
    item = MultiTurnSFTDataset(f, tok, sft_cfg(max_length=128))[0]
    n = int(item["attention_mask"].sum())
    full = tok.apply_chat_template(conv, tokenize=False)
    assert tok.decode(item["input_ids"][:n]) == full
    assert trained_text(tok, item) == "4<|im_end|>6, done<|im_end|>"
    # the trained tokens are exactly the assistant contents + their end-of-turn token, in place
    ids = item["input_ids"].tolist()
    mask = item["loss_mask"].tolist()
    spans = [(i, j) for i in range(n) for j in [i] if mask[i] and (i == 0 or not mask[i - 1])]
    assert len(spans) == 2
    for (start, _), content in zip(spans, ["4", "6, done"], strict=True):
        header = tok.encode("<|im_start|>assistant\n", add_special_tokens=False)
        assert ids[start - len(header) : start] == header and mask[start - 1] == 0
        assert tok.decode(ids[start : start + len(content)]) == content
    assert sum(mask[n:]) == 0


def test_multiturn_errors_and_truncation(tok, tmp_path):
    no_assistant = write(tmp_path / "u.parquet", [{"messages": [{"role": "user", "content": "hi"}]}])
    with pytest.raises(ValueError, match="no assistant message"):
        MultiTurnSFTDataset(no_assistant, tok, sft_cfg())[0]
    with pytest.raises(KeyError, match="data.multiturn.messages_key"):
        MultiTurnSFTDataset(no_assistant, tok, sft_cfg(multiturn={"messages_key": "conversation"}))
    conv = [{"role": "user", "content": "x" * 40}, {"role": "assistant", "content": "y"}]
    f = write(tmp_path / "long.parquet", [{"messages": conv}])
    with pytest.raises(ValueError, match="data.max_length=32"):
        MultiTurnSFTDataset(f, tok, sft_cfg(max_length=32))[0]
    left = MultiTurnSFTDataset(f, tok, sft_cfg(max_length=32, truncation="left"))[0]
    assert left["attention_mask"].all() and trained_text(tok, left) == "y<|im_end|>"


def test_dict_keys_on_verl_gsm8k_layout(tok, tmp_path):
    """verl's gsm8k SFT scripts: data.prompt_key=response_key=extra_info, prompt_dict_keys=[question],
    response_dict_keys=[answer]; the struct may come wrapped in a one-element list."""
    rows = [
        {"extra_info": {"question": "2+3=", "answer": "5", "index": 0, "split": "train"}},
        {"extra_info": {"question": "4*4=", "answer": "16", "index": 1, "split": "train"}},
    ]
    c = sft_cfg(prompt_key="extra_info", response_key="extra_info", prompt_dict_keys=["question"],
                response_dict_keys=["answer"])
    ds = SFTDataset(write(tmp_path / "gsm8k.parquet", rows), tok, c)
    plain = SFTDataset(write(tmp_path / "plain.parquet", [{"prompt": "4*4=", "response": "16"}]), tok, sft_cfg())
    assert trained_text(tok, ds[0]) == "5<|im_end|>" and trained_text(tok, ds[1]) == "16<|im_end|>"
    assert torch.equal(ds[1]["input_ids"], plain[0]["input_ids"])  # same tokens as the plain columns
    assert torch.equal(ds[1]["loss_mask"], plain[0]["loss_mask"])
    wrapped = SFTDataset(write(tmp_path / "wrapped.parquet", [{"e": [rows[1]["extra_info"]]}]), tok,
                         sft_cfg(prompt_key="e", response_key="e", prompt_dict_keys=["question"],
                                 response_dict_keys=["answer"]))
    assert torch.equal(wrapped[0]["input_ids"], plain[0]["input_ids"])
    with pytest.raises(KeyError, match=r"data.response_dict_keys=\['solution'\].*keys are \['answer'"):
        SFTDataset(write(tmp_path / "g2.parquet", rows), tok, OmegaConf.merge(c, {"response_dict_keys": ["solution"]}))[0]
    with pytest.raises(ValueError, match=r"data.response_dict_keys=\[answer\]"):  # the dict itself is no response
        SFTDataset(write(tmp_path / "g3.parquet", rows), tok, OmegaConf.merge(c, {"response_dict_keys": None}))[0]


def test_partial_config_takes_the_sft_schema_defaults(tok, tmp_path):
    """A partial config takes sft_trainer.yaml's defaults for every key it leaves out; bad values name the key."""
    schema = specs(SFTDataConfig)
    rows = [{schema["prompt_key"].default: "2+2=", schema["response_key"].default: "4"}]
    ds = SFTDataset(write(tmp_path / "d.parquet", rows), tok, {})
    assert (ds.prompt_key, ds.response_key) == (schema["prompt_key"].default, schema["response_key"].default)
    assert ds.max_length == schema["max_length"].default and ds[0]["input_ids"].shape == (ds.max_length,)
    mt = MultiTurnSFTDataset(write(tmp_path / "m.parquet", [{"messages": [{"role": "user", "content": "hi"},
                                                                         {"role": "assistant", "content": "yo"}]}]),
                             tok, {"max_length": 64})
    assert mt.messages_key == schema["multiturn.messages_key"].default == "messages"
    with pytest.raises(ConfigError, match=r"data\.max_length=0 must be an integer >= 1"):
        SFTDataset(write(tmp_path / "d.parquet", rows), tok, {"max_length": 0})
    with pytest.raises(ConfigError, match=r"data\.multiturn\.tools_key='t' is not supported"):
        MultiTurnSFTDataset(write(tmp_path / "d.parquet", rows), tok, {"multiturn": {"tools_key": "t"}})
