"""A tiny Qwen3-MoE model through the FSDP2 engine and GRPO with vLLM rollout (fp32, CPU).

- the experts are sharded by FSDP2 (each rank holds half of the experts' rows) and an update over 2 ranks equals
  the single-process update of the same global batch, with every expert, the router and attention moved;
- the weight push splits the fused expert tensors into the checkpoint's per-expert names (checked against the
  files transformers writes);
- ``main_ppo`` GRPO, 2 steps, ``rollout.name=vllm`` with one expert-parallel engine over both workers
  (``data_parallel_size=2``, ``expert_parallel_size=2``: each rank holds half of the experts, the agent loops run
  their engine calls in rounds): vLLM's log-probs of the sampled tokens equal the trainer's after every weight
  push (``training/rollout_probs_diff_max`` <= 1e-3), so the push reached every rank's experts.
"""

import copy
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "workers", "actor"))
sys.path.insert(0, os.path.dirname(__file__))
from engine_testlib import make_batch, run_distributed  # noqa: E402
from test_main_ppo_vllm import REWARD_PY, run_main  # noqa: E402

from verl.protocol import DataProto  # noqa: E402
from verl.utils.embedded.moe import build_moe_model, make_moe_model_dir  # noqa: E402
from verl.utils.fsdp_utils import apply_fsdp2, iter_full_state_dict  # noqa: E402
from verl.utils.hf_experts import unfuse_expert_weights  # noqa: E402
from verl.workers.config import FSDPEngineConfig  # noqa: E402
from verl.workers.engine import FSDPEngine, MicroBatchSpec, TrainSpec  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
LR = 0.1


def _loss(outputs, micro, ctx):
    lp, mask = outputs["log_probs"], micro["response_mask"].float()
    value = -(lp * mask).sum() / mask.sum()
    return value, {"loss": value}


def _step(model, data, dp_group=None):
    engine = FSDPEngine(model, torch.optim.SGD(model.parameters(), lr=LR), dp_group=dp_group,
                        use_remove_padding=True)
    engine.train_batch(data, _loss, TrainSpec(mini_batch_size=len(data), micro=MicroBatchSpec(2)))
    return engine


def _fsdp_worker(rank, world, out_dir):
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    model = apply_fsdp2(build_moe_model(seed=3), FSDPEngineConfig(dtype="fp32", reshard_after_forward=True))
    experts = model.model.layers[0].mlp.experts.gate_up_proj
    assert isinstance(experts, DTensor), type(experts)
    local = experts.to_local()
    assert local.shape[0] == experts.shape[0] // world, (local.shape, experts.shape)  # experts split over ranks
    data = DataProto.from_dict(make_batch(bsz=8, seed=5))
    part = data.chunk(world)[rank]
    engine = _step(model, part, dist.group.WORLD)
    full = dict(engine.iter_full_params())
    if rank == 0:
        torch.save(full, os.path.join(out_dir, "fsdp.pt"))


def test_moe_fsdp2_shards_experts_and_matches_one_process(tmp_path):
    run_distributed(_fsdp_worker, 2, str(tmp_path), err_dir=str(tmp_path))
    got = torch.load(tmp_path / "fsdp.pt")
    start = build_moe_model(seed=3)
    ref = copy.deepcopy(start)
    _step(ref, DataProto.from_dict(make_batch(bsz=8, seed=5)))
    before = dict(start.named_parameters())
    for name, p in ref.named_parameters():
        torch.testing.assert_close(got[name], p.detach(), rtol=1e-5, atol=1e-6, msg=name)
    # gradients reached every expert of every layer, the router and attention
    for layer in range(start.config.num_hidden_layers):
        prefix = f"model.layers.{layer}."
        for e in range(start.config.num_experts):
            moved = (got[prefix + "mlp.experts.gate_up_proj"][e] - before[prefix + "mlp.experts.gate_up_proj"][e])
            assert moved.abs().max() > 0, (layer, e)
        for key in ("mlp.gate.weight", "self_attn.q_proj.weight"):
            assert (got[prefix + key] - before[prefix + key]).abs().max() > 0, prefix + key


def test_unfused_expert_names_and_values_match_the_checkpoint(tmp_path):
    path = make_moe_model_dir(str(tmp_path / "moe"), seed=1)
    on_disk = load_file(os.path.join(path, "model.safetensors"))
    model = build_moe_model(seed=1)
    pushed = dict(unfuse_expert_weights(iter_full_state_dict(model)))
    pushed.pop("lm_head.weight", None)  # tied: the checkpoint stores it once
    assert set(pushed) == set(on_disk), sorted(set(pushed) ^ set(on_disk))[:8]
    for name, tensor in on_disk.items():
        assert torch.equal(pushed[name], tensor), name


@pytest.mark.e2e
@pytest.mark.vllm
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm not installed")
def test_moe_grpo_vllm_rollout_matches_trainer(tmp_path):
    data = tmp_path / "data"
    subprocess.run([sys.executable, str(REPO / "examples/data_preprocess/arithmetic.py"), "--local_dir", str(data),
                    "--train_size", "32", "--test_size", "8"], check=True, cwd=REPO,
                   env=dict(os.environ, PYTHONPATH=str(REPO)))
    (tmp_path / "reward.py").write_text(REWARD_PY)
    model = make_moe_model_dir(str(tmp_path / "moe"), seed=0)
    run_dir = tmp_path / "run"
    args = [
        "algorithm.adv_estimator=grpo", f"data.train_files={data / 'train.parquet'}",
        f"data.val_files={data / 'test.parquet'}", "data.train_batch_size=8", "data.max_prompt_length=48",
        "data.max_response_length=16", f"actor_rollout_ref.model.path={model}",
        "actor_rollout_ref.actor.optim.lr=1e-2", "actor_rollout_ref.actor.ppo_mini_batch_size=8",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8", "actor_rollout_ref.actor.use_kl_loss=False",
        "actor_rollout_ref.actor.fsdp_config.dtype=fp32", "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.dtype=float32", "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.rollout.load_format=dummy",  # step 1 is only right if the first push happened
        # one vLLM engine over both workers: two data-parallel ranks, each holding half of the experts
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1", "actor_rollout_ref.rollout.data_parallel_size=2",
        "actor_rollout_ref.rollout.expert_parallel_size=2",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16",
        "actor_rollout_ref.rollout.max_num_seqs=64", "algorithm.use_kl_in_reward=False",
        f"custom_reward_function.path={tmp_path / 'reward.py'}", "trainer.logger=[console,file]",
        "trainer.val_before_train=False", "trainer.n_gpus_per_node=2", "trainer.nnodes=1",
        "trainer.save_freq=-1", "trainer.test_freq=-1", "trainer.total_training_steps=2",
    ]
    steps = run_main(run_dir, args)
    text = (run_dir / "log.txt").read_text()
    for rank in (0, 1):  # both workers are data-parallel ranks of one engine
        assert f"[rollout] rank {rank}: vllm engine {rank} of 2, tensor_parallel_size=1, tensor rank 0, " \
               f"data-parallel rank {rank} of 2 in one engine" in text, text[-4000:]
    assert sorted(steps) == [1, 2]
    for step, m in steps.items():
        assert m["training/rollout_probs_diff_max"] <= 1e-3, (step, m["training/rollout_probs_diff_max"])
        assert m["response_length/mean"] > 0
    assert any(m.get("actor/grad_norm", 0) > 0 for m in steps.values())
