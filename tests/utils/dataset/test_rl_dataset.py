"""RLHFDataset over verl-schema parquet files, with the embedded tokenizer."""

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from omegaconf import OmegaConf

from verl.trainer.config_schema.spec import specs
from verl.utils.config import ConfigError
from verl.utils.dataset.rl_dataset import (RLHFDataset, collate_fn, create_rl_dataset, create_rl_sampler,
                                           get_dataset_class)
from verl.utils.embedded import load_tokenizer
from verl.utils.embedded.arithmetic import make_rl_rows
from verl.workers.config.data import DataConfig, as_data_config


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer()


def write(path, rows):
    pq.write_table(pa.Table.from_pylist(rows), str(path))
    return str(path)


def cfg(**kw):
    base = dict(
        prompt_key="prompt",
        max_prompt_length=64,
        truncation="error",
        filter_overlong_prompts=False,
        return_raw_chat=False,
        return_full_prompt=False,
        shuffle=True,
        seed=None,
        custom_cls={"path": None, "name": None},
    )
    base.update(kw)
    return OmegaConf.create(base)


def chat_ids(tok, content):
    text = tok.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True, tokenize=False)
    return tok.encode(text, add_special_tokens=False)


@pytest.fixture
def arith_file(tmp_path):
    return write(tmp_path / "train.parquet", make_rl_rows(12, split="train", seed=0))


def test_item_layout_and_passthrough(tok, arith_file):
    ds = RLHFDataset(arith_file, tok, cfg(return_raw_chat=True, return_full_prompt=True))
    assert len(ds) == 12
    item = ds[3]
    row = make_rl_rows(12, split="train", seed=0)[3]
    ids = chat_ids(tok, row["prompt"][0]["content"])
    assert item["raw_prompt_ids"] == ids
    assert item["input_ids"].shape == (64,) and item["input_ids"].dtype == torch.long
    n = len(ids)
    assert item["input_ids"][-n:].tolist() == ids
    assert (item["input_ids"][:-n] == tok.pad_token_id).all()
    assert item["attention_mask"].tolist() == [0] * (64 - n) + [1] * n
    assert item["position_ids"][-n:].tolist() == list(range(n)) and (item["position_ids"][:-n] == 0).all()
    assert item["raw_prompt"] == row["prompt"]
    assert item["full_prompts"] == tok.decode(ids)
    assert item["data_source"] == "arithmetic" and item["reward_model"] == row["reward_model"]
    assert item["extra_info"] == row["extra_info"] and item["index"] == 3
    assert "prompt" not in item  # the prompt column is consumed (verl pops it)
    plain = RLHFDataset(arith_file, tok, cfg())[3]
    assert "raw_prompt" not in plain and "full_prompts" not in plain


def test_collate_fn(tok, arith_file):
    ds = RLHFDataset(arith_file, tok, cfg(return_raw_chat=True))
    batch = collate_fn([ds[i] for i in range(4)])
    assert batch["input_ids"].shape == (4, 64) and batch["attention_mask"].dtype == torch.long
    for key in ("raw_prompt_ids", "raw_prompt", "data_source", "reward_model", "extra_info", "index"):
        assert isinstance(batch[key], np.ndarray) and batch[key].dtype == object and batch[key].shape == (4,), key
    assert batch["raw_prompt_ids"][1] == ds[1]["raw_prompt_ids"]
    same_len = collate_fn([{"l": [1, 2]}, {"l": [3, 4]}])["l"]  # must stay 1-D, not become a (2, 2) array
    assert same_len.shape == (2,) and same_len[1] == [3, 4]


LONG = "0123456789" * 4  # 40 content characters -> 64 tokens with the chat template


@pytest.mark.parametrize("mode", ["left", "right", "middle"])
def test_truncation_modes(tok, tmp_path, mode):
    f = write(tmp_path / "long.parquet", [{"prompt": [{"role": "user", "content": LONG}], "data_source": "x"}])
    full = chat_ids(tok, LONG)
    m = 20
    item = RLHFDataset(f, tok, cfg(max_prompt_length=m, truncation=mode))[0]
    expect = {"left": full[-m:], "right": full[:m], "middle": full[: m // 2] + full[-(m - m // 2) :]}[mode]
    assert item["raw_prompt_ids"] == expect
    assert item["input_ids"].tolist() == expect and item["attention_mask"].sum() == m


def test_truncation_error_names_file_row_and_fix(tok, tmp_path):
    rows = [{"prompt": [{"role": "user", "content": "1+1="}]}, {"prompt": [{"role": "user", "content": LONG}]}]
    f = write(tmp_path / "mixed.parquet", rows)
    ds = RLHFDataset(f, tok, cfg(max_prompt_length=30, truncation="error"))
    assert ds[0]["attention_mask"].sum() > 0
    with pytest.raises(ValueError) as err:
        ds[1]
    msg = str(err.value)
    assert "row 1 of" in msg and "mixed.parquet" in msg and "data.max_prompt_length=30" in msg
    assert "data.truncation=left|right|middle" in msg and "data.filter_overlong_prompts=True" in msg


def test_filter_overlong_prompts(tok, tmp_path):
    rows = [
        {"prompt": [{"role": "user", "content": c}], "extra_info": {"index": i}}
        for i, c in enumerate(["1+1=", LONG, "22+3="])
    ]
    f = write(tmp_path / "f.parquet", rows)
    ds = RLHFDataset(f, tok, cfg(max_prompt_length=30, filter_overlong_prompts=True))
    assert len(ds) == 2 and [ds[i]["index"] for i in range(2)] == [0, 2]
    with pytest.raises(ValueError, match="every prompt .* raise data.max_prompt_length"):
        RLHFDataset(f, tok, cfg(max_prompt_length=5, filter_overlong_prompts=True))


def test_multiple_files_tilde_and_max_samples(tok, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    write(tmp_path / "a.parquet", make_rl_rows(5, split="a", seed=1))
    write(tmp_path / "b.parquet", make_rl_rows(7, split="b", seed=2))
    ds = RLHFDataset(["~/a.parquet", "~/b.parquet"], tok, cfg())
    assert len(ds) == 12
    assert ds[4]["extra_info"]["split"] == "a" and ds[5]["extra_info"]["split"] == "b"
    assert ds[5]["index"] == 0  # extra_info.index of b's first row
    capped = create_rl_dataset(["~/a.parquet", "~/b.parquet"], cfg(train_max_samples=3, shuffle=False), tok, None)
    assert len(capped) == 3 and [capped[i]["extra_info"]["index"] for i in range(3)] == [0, 1, 2]
    val = create_rl_dataset("~/b.parquet", cfg(train_max_samples=3, val_max_samples=-1), tok, None, is_train=False)
    assert len(val) == 7
    shuffled = create_rl_dataset(
        ["~/a.parquet", "~/b.parquet"], cfg(train_max_samples=6, shuffle=True, seed=3), tok, None
    )
    again = create_rl_dataset(["~/a.parquet", "~/b.parquet"], cfg(train_max_samples=6, shuffle=True, seed=3), tok, None)
    assert len(shuffled) == 6 and [r["extra_info"] for r in shuffled.dataframe] == [
        r["extra_info"] for r in again.dataframe
    ]


def test_bad_inputs_name_what_to_fix(tok, tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.parquet"):
        RLHFDataset(str(tmp_path / "nope.parquet"), tok, cfg())
    empty = tmp_path / "empty.parquet"
    pq.write_table(pa.table({"prompt": pa.array([], pa.string())}), str(empty))
    with pytest.raises(ValueError, match="empty.parquet has no rows"):
        RLHFDataset(str(empty), tok, cfg())
    f = write(tmp_path / "q.parquet", [{"question": "1+1=", "answer": "2"}])
    with pytest.raises(KeyError) as err:
        RLHFDataset(f, tok, cfg())
    assert "q.parquet" in str(err.value) and "'prompt'" in str(err.value) and "data.prompt_key" in str(err.value)
    assert "question" in str(err.value)
    ok = RLHFDataset(f, tok, cfg(prompt_key="question"))  # a bare string prompt becomes one user turn
    assert ok[0]["raw_prompt_ids"] == chat_ids(tok, "1+1=")
    junk = tmp_path / "junk.parquet"
    junk.write_text("not parquet")
    with pytest.raises(ValueError, match="junk.parquet is not a readable parquet"):
        RLHFDataset(str(junk), tok, cfg())
    with pytest.raises(ValueError, match="data.truncation='both'"):
        RLHFDataset(f, tok, cfg(prompt_key="question", truncation="both"))
    bad_prompt = write(tmp_path / "bad.parquet", [{"prompt": 3}])
    with pytest.raises(ValueError, match="row 0 of .*bad.parquet: 'prompt' must be a chat list"):
        RLHFDataset(bad_prompt, tok, cfg())[0]


CUSTOM = """
from verl.utils.dataset.rl_dataset import RLHFDataset

class TaggedDataset(RLHFDataset):
    def __getitem__(self, item):
        row = super().__getitem__(item)
        row["tag"] = "custom"
        return row

class HintedDataset(RLHFDataset):
    def _build_messages(self, example):
        return [{"role": "system", "content": "Answer with a number."}] + super()._build_messages(example)

class NotADataset:
    pass
"""


def test_custom_cls(tok, tmp_path, arith_file):
    path = tmp_path / "my_ds.py"
    path.write_text(CUSTOM)
    c = cfg(custom_cls={"path": str(path), "name": "TaggedDataset"})
    cls = get_dataset_class(c)
    assert cls.__name__ == "TaggedDataset"
    ds = create_rl_dataset(arith_file, c, tok, None)
    assert ds[0]["tag"] == "custom" and len(ds) == 12
    assert get_dataset_class(cfg()) is RLHFDataset
    hinted = create_rl_dataset(
        arith_file, cfg(custom_cls={"path": str(path), "name": "HintedDataset"}, return_raw_chat=True), tok, None
    )
    assert hinted[0]["raw_prompt"][0]["role"] == "system"
    assert tok.decode(hinted[0]["raw_prompt_ids"]).startswith("<|im_start|>system\nAnswer with a number.")
    with pytest.raises(AttributeError, match="'Missing' is not defined in .*my_ds.py"):
        get_dataset_class(cfg(custom_cls={"path": str(path), "name": "Missing"}))
    with pytest.raises(FileNotFoundError, match="data.custom_cls.path=.*nothere.py"):
        get_dataset_class(cfg(custom_cls={"path": str(tmp_path / "nothere.py"), "name": "X"}))
    with pytest.raises(TypeError, match="NotADataset"):
        get_dataset_class(cfg(custom_cls={"path": str(path), "name": "NotADataset"}))


# a chat template that writes the tools' names and descriptions before the conversation (as tool-use templates do)
TOOL_TEMPLATE = ("{% if tools %}{% for t in tools %}tool {{ t.function.name }}: {{ t.function.description }}\n"
                 "{% endfor %}{% endif %}{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
                 "{% if add_generation_prompt %}assistant:{% endif %}")


def test_filter_counts_the_tool_schemas_of_data_tool_config_path(tok, tmp_path):
    tools = tmp_path / "tools.yaml"
    tools.write_text("tools:\n  - class_name: verl.tools.calculator_tool.CalculatorTool\n    config: {}\n")
    rows = [{"prompt": [{"role": "user", "content": c}], "extra_info": {"index": i}}
            for i, c in enumerate(["1+1=", "22+3="])]
    f = write(tmp_path / "f.parquet", rows)
    plain = RLHFDataset(f, tok, cfg(max_prompt_length=512, chat_template=TOOL_TEMPLATE))
    with_tools = RLHFDataset(f, tok, cfg(max_prompt_length=512, chat_template=TOOL_TEMPLATE,
                                         filter_overlong_prompts=True, tool_config_path=str(tools)))
    schemas = with_tools._tool_schemas()
    assert schemas and schemas[0]["function"]["name"] == "calculator"
    bare = max(len(plain[i]["raw_prompt_ids"]) for i in range(2))
    rendered = with_tools._prompt_lengths(0, 2, schemas)
    assert min(rendered) > bare  # the schemas are in the measured prompt
    # a budget that fits the bare prompts but not the prompts with the tools' schemas: every row is dropped
    with pytest.raises(ValueError, match="every prompt"):
        RLHFDataset(f, tok, cfg(max_prompt_length=bare, chat_template=TOOL_TEMPLATE, filter_overlong_prompts=True,
                                tool_config_path=str(tools)))
    assert len(RLHFDataset(f, tok, cfg(max_prompt_length=bare, chat_template=TOOL_TEMPLATE,
                                       filter_overlong_prompts=True))) == 2
    with pytest.raises(Exception, match="data.tool_config_path="):
        RLHFDataset(f, tok, cfg(filter_overlong_prompts=True, tool_config_path=str(tmp_path / "missing.yaml")))


def test_filter_workers_keep_the_same_rows(tok, tmp_path):
    rows = make_rl_rows(20, split="train", seed=1)
    for i in range(0, 20, 3):  # every third prompt too long
        rows[i]["prompt"] = [{"role": "user", "content": LONG}]
    f = write(tmp_path / "f.parquet", rows)
    one = RLHFDataset(f, tok, cfg(max_prompt_length=40, filter_overlong_prompts=True))
    three = RLHFDataset(f, tok, cfg(max_prompt_length=40, filter_overlong_prompts=True,
                                    filter_overlong_prompts_workers=3))
    assert len(one) == 13
    assert one._origins == three._origins
    assert [one[i]["raw_prompt_ids"] for i in range(13)] == [three[i]["raw_prompt_ids"] for i in range(13)]


def test_partial_config_takes_the_schema_defaults_and_bad_values_name_the_key(tok, arith_file):
    """verl's research code builds RLHFDataset with a partial dict or DictConfig: every key it leaves out takes the
    schema's default (the one place defaults live); a bad value is refused naming the key."""
    schema = specs(DataConfig)
    ds = RLHFDataset(arith_file, tok, {"prompt_key": "prompt"})
    assert isinstance(ds.data_config, DataConfig) and ds.config == {"prompt_key": "prompt"}
    for name in ("max_prompt_length", "truncation", "return_raw_chat", "return_full_prompt", "image_key"):
        assert getattr(ds, name) == schema[name].default, name
    assert ds[0]["input_ids"].shape == (schema["max_prompt_length"].default,)
    assert ("raw_prompt" in ds[0]) == schema["return_raw_chat"].default
    typed = as_data_config({"max_prompt_length": 96})
    assert RLHFDataset(arith_file, tok, typed).data_config is typed  # a typed section passes through
    with pytest.raises(ConfigError, match=r"data\.max_prompt_length=0 must be an integer >= 1"):
        RLHFDataset(arith_file, tok, {"max_prompt_length": 0})
    with pytest.raises(ConfigError, match=r"data\.return_raw_chat='yes' must be true or false"):
        create_rl_dataset(arith_file, cfg(return_raw_chat="yes"), tok, None)
    with pytest.raises(ConfigError, match=r"unknown key 'data\.sampler\.clas_path' \(did you mean"):
        create_rl_sampler({"sampler": {"clas_path": "x.py"}}, ds)


def test_keys_outside_the_schema_are_left_to_custom_classes(tok, arith_file):
    """A verl script may set data keys of its own (read by its custom dataset): the typed section ignores them,
    the dataset keeps the config as given."""
    root = OmegaConf.create({"data": {"prompt_key": "prompt", "max_prompt_length": 64, "my_hint": "be brief",
                                      "sampler": {"class_path": None, "class_name": None, "mine": 1}}})
    ds = create_rl_dataset(arith_file, root.data, tok, None)
    assert ds.config.my_hint == "be brief" and not hasattr(ds.data_config, "my_hint")
    assert ds.max_prompt_length == 64 and len(list(create_rl_sampler(root.data, ds))) == len(ds)
    with pytest.raises(ConfigError, match=r"data\.max_prompt_length=-1"):  # named by its path in the config
        as_data_config(OmegaConf.merge(root, {"data": {"max_prompt_length": -1}}).data)
