"""Adapter-only LoRA push, pure pieces: PEFT names, vLLM's rank ladder, the adapter config and the atomic write."""

import json
import os

import pytest
import torch
from safetensors.torch import load_file

from verl.workers.rollout.vllm_rollout.lora_adapter import (adapter_config_dict, peft_adapter_name, vllm_max_lora_rank,
                                                            write_adapter_dir)


def test_peft_names_drop_the_adapter_name_and_skip_base_weights():
    key = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight"
    assert peft_adapter_name(key) == "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
    assert peft_adapter_name("base_model.model.model.layers.3.mlp.down_proj.lora_B.default.weight").endswith(
        "mlp.down_proj.lora_B.weight")
    assert peft_adapter_name("base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight") is None
    assert peft_adapter_name("base_model.model.lm_head.weight") is None


def test_vllm_rank_ladder_and_refusal():
    assert [vllm_max_lora_rank(r) for r in (1, 2, 8, 9, 64, 512)] == [1, 8, 8, 16, 64, 512]
    with pytest.raises(ValueError, match="lora_rank=513"):
        vllm_max_lora_rank(513)


def test_adapter_config_from_peft_is_json_safe_and_complete():
    from peft import LoraConfig

    cfg = adapter_config_dict(LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    assert cfg["peft_type"] == "LORA" and cfg["r"] == 4 and cfg["lora_alpha"] == 8
    assert sorted(cfg["target_modules"]) == ["q_proj", "v_proj"]
    json.dumps(cfg)  # enums and sets were converted
    with pytest.raises(ValueError, match="target_modules"):
        adapter_config_dict({"r": 4, "lora_alpha": 8})


def test_write_is_atomic_and_keeps_only_the_newest_version(tmp_path):
    config = {"r": 2, "lora_alpha": 4, "target_modules": ["q_proj"]}
    a = torch.arange(6.0).view(2, 3)
    first = write_adapter_dir(str(tmp_path), 1, [("x.lora_A.weight", a)], config)
    second = write_adapter_dir(str(tmp_path), 2, [("x.lora_A.weight", a * 2)], config)
    assert os.listdir(tmp_path) == ["v2"] and not os.path.exists(first)
    assert torch.equal(load_file(os.path.join(second, "adapter_model.safetensors"))["x.lora_A.weight"], a * 2)
    assert json.load(open(os.path.join(second, "adapter_config.json")))["r"] == 2

    def broken():
        yield "x.lora_A.weight", a
        raise RuntimeError("stream failed")

    with pytest.raises(RuntimeError, match="stream failed"):
        write_adapter_dir(str(tmp_path), 3, broken(), config)
    assert os.listdir(tmp_path) == ["v2"]  # nothing half-written, the served version untouched
    with pytest.raises(ValueError, match="no LoRA tensors"):
        write_adapter_dir(str(tmp_path), 4, [], config)
    assert os.listdir(tmp_path) == ["v2"]
