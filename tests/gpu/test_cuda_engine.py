"""The CUDA path of the training engine, on a real GPU: device seam, FSDP2 over nccl (fp32 exact and bf16
mixed precision), the PPO actor's log-probs and update, and the SFT trainer under torchrun.

Skipped where there is no CUDA GPU (every CI machine of this project). Run on a GPU machine with
``python -m pytest -q tests/gpu``.
"""

import copy
import os
import subprocess
import sys

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "tests", "workers", "actor"))


@pytest.fixture(scope="module")
def nccl_world():
    import torch.distributed as dist

    from engine_testlib import free_port

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="1",
                      LOCAL_RANK="0")
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_device_seam_picks_cuda():
    from verl.utils.device import get_device_name, get_dist_backend, get_ray_resource_name, resolve_device

    assert resolve_device("auto") == "cuda" and get_device_name() == "cuda"
    assert get_dist_backend() == "nccl" and get_ray_resource_name() == "GPU"


def _reference(model, b, temperature):
    sys.path.insert(0, os.path.join(REPO, "tests", "workers", "actor"))
    from test_dp_actor import hf_reference

    return hf_reference(model, b, temperature)


@pytest.mark.parametrize("mode", ["trim", "pack"])
def test_fsdp2_actor_fp32_on_cuda_matches_hf_and_updates(nccl_world, mode, monkeypatch):
    from engine_testlib import actor_config, make_batch, tiny_model

    from verl.protocol import DataProto
    from verl.utils.fsdp_utils import apply_fsdp2, build_optimizer, get_full_state_dict
    from verl.workers.actor.dp_actor import DataParallelPPOActor, typed_actor_config

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    monkeypatch.setenv("VERL_REMOVE_PADDING_MODE", mode)
    b = make_batch(8, 7, 5, seed=3)
    ref_lp, ref_ent = _reference(tiny_model(seed=1), b, 0.7)  # CPU, fp32
    mask = b["response_mask"].bool()
    cfg = actor_config(use_remove_padding=True, log_prob_micro_batch_size_per_gpu=3, ppo_mini_batch_size=8,
                       ppo_micro_batch_size_per_gpu=4)
    model = tiny_model(seed=1)
    apply_fsdp2(model, typed_actor_config(cfg).fsdp_config)
    assert next(model.parameters()).device.type == "cuda"
    actor = DataParallelPPOActor(cfg, model, build_optimizer(model.parameters(), typed_actor_config(cfg).optim))
    data = DataProto.from_dict(copy.deepcopy(b), meta_info={"temperature": 0.7})  # a CPU batch, as workers get
    lp, ent = actor.compute_log_prob(data, calculate_entropy=True)
    assert lp.device.type == "cpu" and ent.device.type == "cpu"
    assert (lp - ref_lp)[mask].abs().max() <= 1e-5, (lp - ref_lp)[mask].abs().max()
    assert (ent - ref_ent)[mask].abs().max() <= 1e-5
    before = {k: v.clone() for k, v in get_full_state_dict(model).items()}
    metrics = actor.update_policy(DataProto.from_dict(copy.deepcopy(b), meta_info={"temperature": 0.7}))
    assert all(torch.isfinite(torch.tensor(metrics["actor/grad_norm"])))
    after = get_full_state_dict(model)
    assert set(after) == set(before) and all(v.device.type == "cpu" for v in after.values())
    assert max((after[k] - before[k]).abs().max().item() for k in after) > 1e-4  # the update moved weights


def test_fsdp2_actor_bf16_mixed_precision_on_cuda(nccl_world):
    from engine_testlib import actor_config, make_batch, tiny_model

    from verl.protocol import DataProto
    from verl.utils.fsdp_utils import apply_fsdp2, build_optimizer
    from verl.workers.actor.dp_actor import DataParallelPPOActor, typed_actor_config

    b = make_batch(8, 7, 5, seed=5)
    ref_lp, _ = _reference(tiny_model(seed=2), b, 1.0)
    mask = b["response_mask"].bool()
    cfg = actor_config(log_prob_micro_batch_size_per_gpu=8, ppo_mini_batch_size=8, ppo_micro_batch_size_per_gpu=8,
                       fsdp_config=dict(dtype="bfloat16", model_dtype="fp32"))
    model = tiny_model(seed=2)
    apply_fsdp2(model, typed_actor_config(cfg).fsdp_config)
    actor = DataParallelPPOActor(cfg, model, build_optimizer(model.parameters(), typed_actor_config(cfg).optim))
    lp, _ = actor.compute_log_prob(DataProto.from_dict(copy.deepcopy(b), meta_info={"temperature": 1.0}))
    err = (lp - ref_lp)[mask].abs().max().item()
    assert 0 < err < 0.1, err  # bf16 rounding: not exact, not a wrong token
    # fp32 master weights stay fp32 under bf16 compute
    assert all(p.dtype == torch.float32 for p in model.parameters())
    metrics = actor.update_policy(DataProto.from_dict(copy.deepcopy(b), meta_info={"temperature": 1.0}))
    assert all(torch.isfinite(torch.tensor(metrics["actor/grad_norm"])))


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_sft_trainer_under_torchrun_on_cuda(tmp_path, dtype):
    """The whole SFT trainer on the GPU (torchrun, nccl), fp32 or bf16 mixed precision (model.fsdp_config.dtype):
    loss falls and an HF model is written."""
    data_dir, model_dir, out = tmp_path / "data", tmp_path / "model", tmp_path / "sft"
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""), HF_HUB_OFFLINE="1")
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    subprocess.run([sys.executable, "examples/data_preprocess/arithmetic.py", "--local_dir", str(data_dir), "--sft",
                    "--train_size", "2000", "--test_size", "64", "--max_digits", "1"], cwd=REPO, env=env, check=True)
    subprocess.run([sys.executable, "-m", "verl.utils.embedded.make_model", "--size", "tiny", "--out", str(model_dir)],
                   cwd=REPO, env=env, check=True)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes=1", "--nproc_per_node=1",
           "-m", "verl.trainer.fsdp_sft_trainer",
           f"data.train_files={data_dir}/sft/train.parquet", f"data.val_files={data_dir}/sft/test.parquet",
           "data.prompt_key=prompt", "data.response_key=response", "data.max_length=32",
           "data.train_batch_size=64", "data.micro_batch_size_per_gpu=32", f"model.partial_pretrain={model_dir}",
           "optim.lr=3e-3", "trainer.total_training_steps=30", "trainer.test_freq=15", "trainer.logger=[console]",
           f"trainer.default_local_dir={out}", "trainer.project_name=gpu", "trainer.experiment_name=sft",
           f"model.fsdp_config.dtype={dtype}"]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    losses = [float(part.split(":")[1]) for line in log.splitlines() if line.startswith("step:")
              for part in line.split(" - ") if part.startswith("train/loss:")]
    assert len(losses) >= 20 and losses[-1] < 0.5 * losses[0], losses
    assert (out / "global_step_30" / "huggingface" / "config.json").exists()


def test_hybrid_engine_push_into_hf_rollout_on_cuda(nccl_world, tmp_path):
    """FSDP2 actor on the GPU -> update -> weight push into an HF rollout engine on the GPU -> generate: the
    engine's log-probs of its own samples equal the trainer's (fp32, TF32 off), the weight-sync check of
    docs/hybrid_engine.md."""
    from engine_testlib import actor_config
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from verl.protocol import DataProto
    from verl.utils.embedded import make_model_dir
    from verl.utils.fsdp_utils import apply_fsdp2, build_optimizer
    from verl.workers.actor.dp_actor import DataParallelPPOActor, typed_actor_config
    from verl.workers.rollout.hf_rollout import HFRollout
    from verl.workers.sharding_manager import FSDPRolloutShardingManager

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model_dir = make_model_dir(str(tmp_path / "tiny"), size="tiny")
    cfg = dict(name="hf", n=4, temperature=1.0, top_p=1.0, top_k=-1, do_sample=True, response_length=6,
               dtype="float32")
    rollout = HFRollout(cfg, model_dir, device="cuda")
    actor_module = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    acfg = actor_config(log_prob_micro_batch_size_per_gpu=16, ppo_mini_batch_size=16, ppo_micro_batch_size_per_gpu=8)
    apply_fsdp2(actor_module, typed_actor_config(acfg).fsdp_config)
    optimizer = build_optimizer(actor_module.parameters(), typed_actor_config(acfg).optim)
    actor = DataParallelPPOActor(acfg, actor_module, optimizer)
    manager = FSDPRolloutShardingManager(actor_module, rollout)

    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.padding_side = "left"
    enc = tok(["1+2=", "12+30=", "7-9=", "4+4="], return_tensors="pt", padding=True)
    pos = torch.clamp(enc["attention_mask"].cumsum(-1) - 1, min=0)
    prompts = DataProto.from_dict({"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"],
                                   "position_ids": pos})
    for step in range(2):
        with manager:  # pushes the actor's current weights (after step 0's update)
            out = rollout.generate_sequences(prompts)
        batch = out.batch
        lp, _ = actor.compute_log_prob(DataProto(batch=batch.clone(), meta_info={"temperature": 1.0}))
        mask = batch["attention_mask"][:, -batch["responses"].shape[1]:].bool()
        diff = (lp - batch["rollout_log_probs"].cpu())[mask].abs().max().item()
        assert diff <= 1e-4, (step, diff)
        # an update, so that the next step's push carries changed weights
        upd = batch.clone()
        upd["old_log_probs"] = lp
        upd["advantages"] = torch.randn(lp.shape)
        upd["response_mask"] = mask.long()
        actor.update_policy(DataProto(batch=upd, meta_info={"temperature": 1.0}))
        manager.bump_weight_version()
    assert manager.num_pushes == 2
