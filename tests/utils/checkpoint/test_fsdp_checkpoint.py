"""FSDPCheckpointManager: exact resume on 2 FSDP2 ranks (model, optimizer, scheduler, RNG), atomic layout,
max_ckpt_to_keep, HF side folder; the model merger turns the shards back into an HF model."""

import copy
import json
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "workers", "actor"))
from engine_testlib import actor_config, make_batch, run_distributed, tiny_model  # noqa: E402

from verl.protocol import DataProto  # noqa: E402

BATCH_A = make_batch(4, 6, 5, seed=11)
BATCH_B = make_batch(4, 6, 5, seed=12)


def _build(cfg, seed):
    from verl.utils.fsdp_utils import apply_fsdp2, build_lr_scheduler, build_optimizer
    from verl.workers.actor.dp_actor import DataParallelPPOActor, typed_actor_config

    model = tiny_model(seed=seed)
    typed = typed_actor_config(cfg)
    apply_fsdp2(model, typed.fsdp_config)
    optim = build_optimizer(model.parameters(), typed.optim)
    sched = build_lr_scheduler(optim, typed.optim, total_steps=10)
    return model, optim, sched, DataParallelPPOActor(cfg, model, optim)


def _step(actor, sched, batch, rank):
    mine = {k: v[rank * 2 : rank * 2 + 2] for k, v in batch.items()}
    actor.update_policy(DataProto.from_dict(copy.deepcopy(mine), meta_info={"temperature": 1.0}))
    sched.step()


def _ckpt_worker(rank, world, root, cfg_dict):
    from omegaconf import OmegaConf

    from verl.trainer.config_schema.engine import CheckpointConfig
    from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager
    from verl.utils.embedded import load_tokenizer
    from verl.utils.fsdp_utils import get_full_state_dict

    cfg = OmegaConf.create(cfg_dict)
    tok = load_tokenizer()
    model, optim, sched, actor = _build(cfg, seed=3)
    mgr = FSDPCheckpointManager(model, optim, sched, tok,
                                checkpoint_config=CheckpointConfig(save_contents=["model", "optimizer", "extra",
                                                                                  "hf_model"]))
    _step(actor, sched, BATCH_A, rank)
    ckpt1 = os.path.join(root, "global_step_1", "actor")
    mgr.save_checkpoint(local_path=ckpt1, global_step=1, max_ckpt_to_keep=2)
    saved_state = get_full_state_dict(model)
    rng_after_save = torch.rand(3)
    _step(actor, sched, BATCH_B, rank)
    state_a = get_full_state_dict(model)
    lr_a = sched.get_last_lr()[0]

    # a fresh model with other weights, restored from the checkpoint, takes the same step
    model2, optim2, sched2, actor2 = _build(cfg, seed=9)
    mgr2 = FSDPCheckpointManager(model2, optim2, sched2, tok)
    mgr2.load_checkpoint(ckpt1)
    rng_after_load = torch.rand(3)
    loaded_state = get_full_state_dict(model2)
    _step(actor2, sched2, BATCH_B, rank)
    state_b = get_full_state_dict(model2)

    for step in (2, 3):  # keep 2: global_step_1 goes away
        mgr.save_checkpoint(local_path=os.path.join(root, f"global_step_{step}", "actor"), global_step=step,
                            max_ckpt_to_keep=2)
    if rank == 0:
        torch.save({"saved": saved_state, "loaded": loaded_state, "a": state_a, "b": state_b, "lr_a": lr_a,
                    "lr_b": sched2.get_last_lr()[0], "rng": (rng_after_save, rng_after_load),
                    "final": get_full_state_dict(model)}, os.path.join(root, "result.pt"))
    else:
        get_full_state_dict(model)


@pytest.mark.e2e
def test_exact_resume_and_merge(tmp_path):
    from omegaconf import OmegaConf

    cfg = actor_config(ppo_mini_batch_size=2, use_kl_loss=True,
                       optim={"lr": 1e-2, "lr_scheduler_type": "cosine", "lr_warmup_steps": 1})
    run_distributed(_ckpt_worker, 2, str(tmp_path), OmegaConf.to_container(cfg), err_dir=str(tmp_path))
    res = torch.load(tmp_path / "result.pt", weights_only=False)
    for k in res["saved"]:
        assert torch.equal(res["saved"][k], res["loaded"][k]), k
        assert torch.equal(res["a"][k], res["b"][k]), (k, (res["a"][k] - res["b"][k]).abs().max())
    assert any(not torch.equal(res["a"][k], res["saved"][k]) for k in res["a"])
    assert res["lr_a"] == res["lr_b"]
    assert torch.equal(*res["rng"])

    # layout: old checkpoint pruned, nothing half-written left behind
    assert not (tmp_path / "global_step_1").exists()
    ckpt = tmp_path / "global_step_3" / "actor"
    names = set(os.listdir(ckpt))
    assert {"model_world_size_2_rank_0.pt", "model_world_size_2_rank_1.pt", "optim_world_size_2_rank_0.pt",
            "extra_state_world_size_2_rank_1.pt", "fsdp_config.json", "huggingface"} <= names
    assert not [p for p in os.listdir(tmp_path / "global_step_3") if p.endswith((".tmp", ".old"))]
    assert not [p for p in os.listdir(ckpt) if p.startswith("lora")]
    hf_files = set(os.listdir(ckpt / "huggingface"))
    assert {"config.json", "model.safetensors", "tokenizer_config.json"} <= hf_files

    # model merger: shards -> HF dir whose outputs equal the trained model's
    from transformers import AutoModelForCausalLM

    from verl.model_merger.__main__ import main

    target = tmp_path / "merged"
    assert main(["merge", "--backend", "fsdp", "--local_dir", str(ckpt), "--target_dir", str(target)]) == 0
    merged = AutoModelForCausalLM.from_pretrained(str(target), dtype=torch.float32)
    trained = tiny_model(seed=0)
    trained.load_state_dict(res["final"])
    ids = BATCH_A["input_ids"][:, 3:]
    with torch.no_grad():
        assert torch.equal(merged(input_ids=ids).logits, trained(input_ids=ids).logits)
    hf_copy = AutoModelForCausalLM.from_pretrained(str(ckpt / "huggingface"), dtype=torch.float32)
    with torch.no_grad():
        assert torch.equal(hf_copy(input_ids=ids).logits, trained(input_ids=ids).logits)
    assert main(["test", "--backend", "fsdp", "--local_dir", str(ckpt), "--test_hf_dir", str(target)]) == 0


def test_single_process_lora_checkpoint_merges(tmp_path):
    """Unsharded LoRA model: checkpoint -> merger gives the merged base weights under HF names."""
    from verl.model_merger.fsdp_model_merger import FSDPModelMerger
    from verl.model_merger.base_model_merger import ModelMergerConfig
    from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager
    from verl.utils.fsdp_utils import apply_lora, build_optimizer, get_full_state_dict
    from verl.workers.config import FSDPOptimizerConfig

    model = apply_lora(tiny_model(seed=5), lora_rank=2, lora_alpha=4)
    with torch.no_grad():  # non-zero B so the merge matters
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.1)
    optim = build_optimizer(model.parameters(), FSDPOptimizerConfig(lr=1e-3))
    FSDPCheckpointManager(model, optim, None, None).save_checkpoint(local_path=str(tmp_path / "actor"), global_step=1)
    adapter = json.loads((tmp_path / "actor" / "lora_adapter" / "adapter_config.json").read_text())
    assert (adapter["r"], adapter["lora_alpha"]) == (2, 4)
    assert (tmp_path / "actor" / "lora_adapter" / "adapter_model.safetensors").exists()
    merged = FSDPModelMerger(ModelMergerConfig("merge", "fsdp", str(tmp_path / "actor"))).full_state_dict()
    expect = get_full_state_dict(model)
    assert set(merged) == set(expect)
    for k in expect:
        assert torch.allclose(merged[k], expect[k], atol=1e-6), k
