"""FSDPRolloutShardingManager: push-only-when-changed, the skip-sync fault switch, LoRA merging, and a real
2-rank FSDP2 (gloo) push of DTensor shards into per-rank HF rollout engines."""

import os
import socket

import pytest
import torch
import torch.multiprocessing as mp

from verl.workers.rollout.hf_rollout import HFRollout
from verl.workers.sharding_manager import FSDPRolloutShardingManager
from verl.workers.sharding_manager.fsdp_rollout import SKIP_SYNC_ENV, iter_hf_named_tensors

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
    rollout = HFRollout(CFG, model_dir)
    with FSDPRolloutShardingManager(peft_model, rollout):
        pass
    merged = peft_model.merge_and_unload()
    for name, t in merged.state_dict().items():
        assert torch.allclose(t, rollout.module.state_dict()[name], atol=1e-6), name


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _fsdp_worker(rank, world, port, model_dir, result_dir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        torch.manual_seed(0)
        actor = _load(model_dir)
        reference = {k: v.clone() for k, v in actor.state_dict().items()}
        for layer in actor.model.layers:
            fully_shard(layer)
        fully_shard(actor)
        rollout = HFRollout(CFG, model_dir)
        with torch.no_grad():  # change the sharded weights the same way on every rank
            for name, p in actor.named_parameters():
                p.add_(0.01 * (len(name) % 7))
                reference[name] = reference[name] + 0.01 * (len(name) % 7)
        names = [n for n, _ in iter_hf_named_tensors(actor)]
        manager = FSDPRolloutShardingManager(actor, rollout)
        with manager:
            pass
        ok = all(torch.allclose(rollout.module.state_dict()[k], reference[k]) for k in reference
                 if k != "lm_head.weight")
        torch.save({"ok": ok, "names": names, "push_s": manager.timing["update_weights"]},
                   os.path.join(result_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.mark.e2e
def test_fsdp2_two_ranks_stream_full_tensors(model_dir, tmp_path):
    mp.start_processes(_fsdp_worker, args=(2, _free_port(), model_dir, str(tmp_path)), nprocs=2,
                       start_method="spawn")
    results = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    assert all(r["ok"] for r in results)
    assert results[0]["names"] == results[1]["names"] and "model.embed_tokens.weight" in results[0]["names"]
