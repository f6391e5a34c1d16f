"""The Megatron engine's CUDA path on a real GPU (one device: TP=1, PP=1, nccl), against the FSDP engine on the
same GPU and weights: fp32 log-probs, entropies, grad norm and the weights after one PPO step agree; bf16 compute
stays close to fp32. Skipped where there is no CUDA GPU (every CI machine of this project). Run on a GPU machine
with ``python -m pytest -q tests/gpu/test_cuda_megatron.py`` (its own process: megatron's parallel state is global).
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
pytest.importorskip("megatron.core")

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "workers", "actor"))

LR = 1e-3  # small enough that Adam's sign-like first step leaves fp32 rounding differences below the tolerance


@pytest.fixture(scope="module")
def nccl_world():
    import torch.distributed as dist

    from engine_testlib import free_port

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="1",
                      LOCAL_RANK="0")
    os.environ.pop("VERL_DEVICE", None)
    torch.cuda.set_device(0)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dist.init_process_group("nccl", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _batch():
    from engine_testlib import make_batch

    from verl.protocol import DataProto

    data = DataProto.from_dict(make_batch(bsz=4, prompt_len=6, resp_len=5, with_ref=False))
    data.meta_info.update(micro_batch_size=2, temperature=1.0)
    return data


def _run(engine):
    from engine_testlib import actor_config

    from verl.workers.actor.dp_actor import DataParallelPPOActor

    actor = DataParallelPPOActor(config=actor_config(optim={"lr": LR}), engine=engine)
    log_probs, entropy = actor.compute_log_prob(_batch(), calculate_entropy=True)
    metrics = actor.update_policy(_batch())
    return log_probs, entropy, metrics, {k: v.float().cpu() for k, v in engine.iter_full_params()}


def _megatron(model_dir, dtype):
    from engine_testlib import actor_config

    from verl.workers.actor.dp_actor import typed_actor_config
    from verl.workers.engine import get_engine_cls
    from verl.workers.engine.config import EngineConfig

    cfg = EngineConfig(model_path=model_dir, name=f"actor_{dtype}", strategy="megatron",
                       megatron={"tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 1,
                                 "dtype": dtype},
                       optim=typed_actor_config(actor_config(optim={"lr": LR})).optim, grad_clip=1.0,
                       total_training_steps=10)
    engine = get_engine_cls("megatron").build(cfg)
    assert engine.device.type == "cuda"
    return engine


def _fsdp(model_dir):
    from engine_testlib import actor_config
    from transformers import AutoModelForCausalLM

    from verl.utils.fsdp_utils import apply_fsdp2, build_lr_scheduler, build_optimizer
    from verl.workers.engine import FSDPEngine
    from verl.workers.engine.config import actor_engine_config

    cfg = actor_config(optim={"lr": LR})
    module = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    engine_cfg = actor_engine_config({"model": {"path": model_dir}, "actor": cfg})
    apply_fsdp2(module, engine_cfg.fsdp)
    assert next(module.parameters()).device.type == "cuda"
    optimizer = build_optimizer(module.parameters(), engine_cfg.optim)
    return FSDPEngine(module, optimizer, build_lr_scheduler(optimizer, engine_cfg.optim, 10), grad_clip=1.0)


def test_megatron_on_cuda_matches_fsdp_on_cuda_fp32_and_bf16_stays_close(nccl_world, tmp_path):
    from engine_testlib import make_batch, make_model_dir
    from safetensors.torch import load_file

    model_dir = make_model_dir(str(tmp_path / "model"), seed=0, tie=False)
    mask = make_batch(bsz=4, prompt_len=6, resp_len=5, with_ref=False)["response_mask"].bool()
    ref_lp, ref_ent, ref_metrics, ref_w = _run(_fsdp(model_dir))
    lp, ent, metrics, weights = _run(_megatron(model_dir, "fp32"))
    assert (lp - ref_lp)[mask].abs().max() < 1e-5
    assert (ent - ref_ent)[mask].abs().max() < 1e-5
    assert metrics["actor/grad_norm"] == pytest.approx(ref_metrics["actor/grad_norm"], rel=1e-4)
    for name, tensor in ref_w.items():
        assert (weights[name] - tensor).abs().max().item() < 1e-5, name
    before = load_file(os.path.join(model_dir, "model.safetensors"))
    assert max((weights[k] - before[k]).abs().max().item() for k in before) > 1e-4  # the step moved the weights

    lp16, _, metrics16, _ = _run(_megatron(model_dir, "bf16"))
    err = (lp16 - ref_lp)[mask].abs().max().item()
    assert 0 < err < 0.1, err  # bf16 rounding: not exact, not a different model
    assert all(torch.isfinite(torch.tensor(metrics16["actor/grad_norm"])).reshape(-1))
