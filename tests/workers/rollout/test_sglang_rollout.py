"""SGLangRollout without SGLang hardware: the clear error when SGLang or CUDA is missing, and the pure helpers.

The engine path itself is not verified here (SGLang needs CUDA-only packages; our machines are CPU-only)."""

import importlib.util

import pytest
import torch

from verl.workers.rollout.base import BaseRollout
from verl.workers.rollout.sglang_rollout import SGLangRollout, check_sglang_available, sglang_sampling_params
from verl.workers.rollout.sglang_rollout.sglang_rollout import _engine_kwargs, bucket_named_tensors

def test_construction_without_cuda_names_the_alternatives(monkeypatch):
    assert issubclass(SGLangRollout, BaseRollout)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError) as err:
        SGLangRollout(config={"response_length": 8}, model_path="/nonexistent")
    msg = str(err.value)
    assert "SGLang needs CUDA" in msg and "rollout.name=vllm" in msg and "rollout.name=hf" in msg


def test_construction_without_sglang_package(monkeypatch):
    """With a GPU but no sglang package the error says how to install it (or which engine to use instead)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "sglang" else real_find_spec(name, *a))
    with pytest.raises(RuntimeError, match="sglang package is not installed.*rollout.name=vllm"):
        check_sglang_available()


def test_factory_error_names_the_fix():
    from verl.workers.rollout import get_rollout_class

    if importlib.util.find_spec("sglang") is None:
        with pytest.raises(ImportError, match="rollout.name"):
            get_rollout_class("sglang")
    else:
        assert get_rollout_class("sglang") is SGLangRollout


def test_sampling_params_mapping():
    sample = dict(n=4, temperature=0.7, top_p=0.9, top_k=-1, do_sample=True)
    sp = sglang_sampling_params(sample, 32, [2, 7], ignore_eos=False)
    assert sp == dict(max_new_tokens=32, n=1, ignore_eos=False, skip_special_tokens=False, temperature=0.7,
                      top_p=0.9, top_k=-1, stop_token_ids=[2, 7])
    greedy = sglang_sampling_params(dict(n=1, temperature=0.0, top_p=1.0, top_k=-1, do_sample=False), 8, [], True)
    assert greedy["temperature"] == 0.0 and greedy["ignore_eos"] and "stop_token_ids" not in greedy
    assert sglang_sampling_params(dict(sample, top_k=5), 8, [2], True)["top_k"] == 5


def test_weight_buckets_and_engine_kwargs():
    named = [(f"w{i}", torch.zeros(256)) for i in range(5)]  # 1 KiB each
    buckets = list(bucket_named_tensors(named, bucket_bytes=2048))
    assert [len(b) for b in buckets] == [2, 2, 1]
    assert [n for b in buckets for n, _ in b] == [n for n, _ in named]
    assert [len(b) for b in bucket_named_tensors([("big", torch.zeros(4096))], 1024)] == [1]
    kw = _engine_kwargs(dict(prompt_length=16, response_length=8, dtype="float32", gpu_memory_utilization=0.4,
                             tensor_model_parallel_size=2, engine_kwargs={"sglang": {"attention_backend": "fa3"}}),
                        "/m", False)
    assert kw["context_length"] == 24 and kw["dtype"] == "float32" and kw["mem_fraction_static"] == 0.4
    assert kw["tp_size"] == 2 and kw["attention_backend"] == "fa3" and kw["skip_tokenizer_init"]
