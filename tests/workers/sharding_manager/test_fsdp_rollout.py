"""FSDPRolloutShardingManager: push-only-when-changed, the skip-sync fault switch, LoRA merging.

The 2-rank FSDP2 (gloo) push through Ray workers is covered end to end in tests/workers/test_fsdp_workers.py.
"""

import pytest
import torch

from verl.workers.rollout.hf_rollout import HFRollout
from verl.workers.sharding_manager import FSDPRolloutShardingManager
from verl.workers.sharding_manager.fsdp_rollout import (SKIP_SYNC_ENV, _fallback_full_state_iter, _lora_scaling,
                                                        iter_hf_named_tensors, merge_lora_stream)

CFG = dict(name="hf", n=1, temperature=1.0, top_p=1.0, top_k=-1, do_sample=True, response_length=4, dtype="float32")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from verl.utils.embedded import make_model_dir

    return make_model_dir(str(tmp_path_factory.mktemp("tiny")), size="tiny")


def _load(model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)


def _same_weights(a, b) -> bool:
    sb = b.state_dict()
    return all(torch.equal(t, sb[k]) for k, t in a.state_dict().items())


def _perturb(module, scale=0.05):
    with torch.no_grad():
        for p in module.parameters():
            p.add_(scale * torch.randn_like(p))


def test_push_only_when_version_changes(model_dir):
    actor, rollout = _load(model_dir), HFRollout(CFG, model_dir)
    manager = FSDPRolloutShardingManager(actor, rollout, skip_weight_sync=False)
    with manager:  # first entry always pushes
        pass
    assert manager.num_pushes == 1 and manager.timing["update_weights"] > 0
    with manager:  # nothing changed: no push
        pass
    assert manager.num_pushes == 1 and manager.timing["update_weights"] == 0.0
    _perturb(actor)
    assert not _same_weights(actor, rollout.module)
    manager.bump_weight_version()
    with manager:
        pass
    assert manager.num_pushes == 2 and _same_weights(actor, rollout.module)


def test_layered_summon_gathers_one_parameter_at_a_time(model_dir):
    actor, rollout = _load(model_dir), HFRollout(CFG, model_dir)
    bucketed = FSDPRolloutShardingManager(actor, rollout)
    layered = FSDPRolloutShardingManager(actor, rollout, layered_summon=True)
    assert layered.full_state_iter.keywords == {"bucket_bytes": 0}
    assert bucketed.full_state_iter is iter_hf_named_tensors  # default: 256 MB buckets
    _perturb(actor)
    with layered:  # same push either way
        pass
    assert _same_weights(actor, rollout.module)


def test_skip_sync_leaves_engine_stale(model_dir, monkeypatch):
    monkeypatch.setenv(SKIP_SYNC_ENV, "1")
    actor, rollout = _load(model_dir), HFRollout(CFG, model_dir)
    manager = FSDPRolloutShardingManager(actor, rollout)
    assert manager.skip_weight_sync and manager._skip_weight_sync_for_test
    _perturb(actor)
    manager.bump_weight_version()
    with manager:
        pass
    assert manager.num_pushes == 0 and not _same_weights(actor, rollout.module)


def test_lora_actor_pushes_merged_weights(model_dir):
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    peft_model = get_peft_model(_load(model_dir), LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    with torch.no_grad():  # make B non-zero so the merge matters
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1)
    rollout, fallback_rollout = HFRollout(CFG, model_dir), HFRollout(CFG, model_dir)
    with FSDPRolloutShardingManager(peft_model, rollout):  # the engine's stream (verl.utils.fsdp_utils)
        pass
    # the manager's own fallback stream + merge gives the same plain HF weights
    fallback_rollout.update_weights(merge_lora_stream(_fallback_full_state_iter(peft_model), _lora_scaling(peft_model)))
    merged = peft_model.merge_and_unload()
    for name, t in merged.state_dict().items():
        assert torch.allclose(t, rollout.module.state_dict()[name], atol=1e-6), name
        assert torch.allclose(t, fallback_rollout.module.state_dict()[name], atol=1e-6), name


class _AdapterEngine:
    """Records what reaches an engine that serves LoRA adapters (the vLLM rollout's two push methods)."""

    supports_lora_adapter = True

    def __init__(self):
        self.base_pushes, self.adapter_pushes = [], []
        self.last_update_stats = {}

    def resume(self):
        pass

    def release_cache(self):
        pass

    def update_weights(self, tensors):
        names = [name for name, _ in tensors]
        self.base_pushes.append(names)
        self.last_update_stats = {"num_tensors": float(len(names)), "num_bytes": 1000.0}

    def update_lora_adapter(self, tensors, config):
        pairs = list(tensors)
        self.adapter_pushes.append(([n for n, _ in pairs], config))
        self.last_update_stats = {"num_tensors": float(len(pairs)), "num_bytes": 10.0}


def test_lora_actor_adapter_only_push_sends_base_once(model_dir):
    from peft import LoraConfig, get_peft_model

    actor = get_peft_model(_load(model_dir), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    engine = _AdapterEngine()
    manager = FSDPRolloutShardingManager(actor, engine)
    assert manager.lora_adapter_push
    with manager:
        pass
    base_names = engine.base_pushes[0]
    assert "model.layers.0.self_attn.q_proj.weight" in base_names  # plain HF names, not merged, no PEFT wrapper
    assert not any("lora_" in n or "base_layer" in n or n.startswith("base_model") for n in base_names)
    names, config = engine.adapter_pushes[0]
    assert names and all(".lora_A.weight" in n or ".lora_B.weight" in n for n in names)
    assert config["r"] == 4 and sorted(config["target_modules"]) == ["q_proj", "v_proj"]
    peak = manager.push_stats.pop("weight_push_peak_mem_gb")
    assert 0 < peak < 1024  # this process's resident memory during the push, in GiB
    assert manager.push_stats == {"weight_push_tensors": len(base_names) + len(names),
                                  "weight_push_bytes": 1010.0, "weight_push_base": 1.0}
    manager.bump_weight_version()
    with manager:
        pass
    assert len(engine.base_pushes) == 1 and len(engine.adapter_pushes) == 2
    assert manager.push_stats["weight_push_base"] == 0.0 and manager.push_stats["weight_push_bytes"] == 10.0
    # lora_merge=True (or an engine without adapters) keeps the merged full push
    merged = FSDPRolloutShardingManager(actor, engine, lora_merge=True)
    assert not merged.lora_adapter_push


class _WakeRecorder:
    """An engine that records its wake-ups and weight pushes, in order."""

    def __init__(self):
        self.calls = []

    def resume(self, tags=None):
        self.calls.append(("resume", tags))

    def release_cache(self):
        self.calls.append(("release", None))

    def update_weights(self, tensors):
        self.calls.append(("push", len(list(tensors))))


def test_multi_stage_wake_up_wakes_the_weights_for_the_push_and_the_cache_after_it(model_dir):
    staged, plain = _WakeRecorder(), _WakeRecorder()
    with FSDPRolloutShardingManager(_load(model_dir), staged, multi_stage_wake_up=True):
        pass
    with FSDPRolloutShardingManager(_load(model_dir), plain):
        pass
    assert [c[0] for c in staged.calls] == ["resume", "push", "resume", "release"]
    assert staged.calls[0][1] == ("weights",) and staged.calls[2][1] == ("kv_cache",)
    assert [c[0] for c in plain.calls] == ["resume", "push", "release"] and plain.calls[0][1] is None


def test_vllm_rollout_wakes_by_part_and_is_awake_when_both_parts_are():
    from verl.workers.rollout.vllm_rollout.vllm_rollout import vLLMRollout

    class _LLM:
        def __init__(self):
            self.calls = []

        def wake_up(self, tags=None):
            self.calls.append(tags)

    rollout = object.__new__(vLLMRollout)  # the wake-up bookkeeping only (no engine is started)
    rollout.llm, rollout._sleeping, rollout._woken = _LLM(), True, set()
    rollout.resume(("weights",))
    assert rollout.llm.calls == [["weights"]] and rollout._sleeping
    rollout.resume(("weights",))  # already awake: nothing
    rollout.resume(("kv_cache",))
    assert rollout.llm.calls == [["weights"], ["kv_cache"]] and not rollout._sleeping
    rollout.resume()  # awake: nothing
    rollout._sleeping = True
    rollout.resume()  # everything at once: vLLM's plain wake_up()
    assert rollout.llm.calls[-1] is None and not rollout._sleeping
