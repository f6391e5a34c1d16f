"""DataParallelPPOCritic: values equal a plain forward (padded and packed), 2 FSDP2 ranks update like one process,
the value loss is clipped with cliprange_value."""

import copy
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "actor"))
from engine_testlib import make_batch, make_model_dir, run_distributed  # noqa: E402

from verl.protocol import DataProto  # noqa: E402
from verl.utils.config import omega_conf_to_dataclass  # noqa: E402
from verl.utils.fsdp_utils import build_optimizer  # noqa: E402
from verl.workers.config import FSDPEngineConfig  # noqa: E402
from verl.workers.critic.dp_critic import DataParallelPPOCritic, typed_critic_config  # noqa: E402


def critic_config(**kw):
    from omegaconf import OmegaConf

    cfg = dict(ppo_mini_batch_size=4, ppo_micro_batch_size_per_gpu=2, forward_micro_batch_size_per_gpu=3,
               use_dynamic_bsz=False, ppo_max_token_len_per_gpu=64, forward_max_token_len_per_gpu=64, ppo_epochs=1,
               shuffle=False, cliprange_value=0.5, loss_agg_mode="token-mean", grad_clip=1.0,
               model={"use_remove_padding": False}, optim={"lr": 1e-2, "weight_decay": 0.0},
               fsdp_config={"dtype": "fp32"})
    return OmegaConf.merge(OmegaConf.create(cfg), OmegaConf.create(kw))


@pytest.fixture(scope="module")
def critic_dir(tmp_path_factory):
    return make_model_dir(str(tmp_path_factory.mktemp("critic")), seed=6)


def _critic(path, seed_head=True):
    from verl.utils.model import load_value_model

    model = load_value_model(path, dtype="fp32")
    if seed_head:  # a non-zero head so values are not all 0
        torch.manual_seed(0)
        torch.nn.init.normal_(model.score.weight, std=0.5)
    return model


@pytest.mark.parametrize("rmpad,mode", [(False, ""), (True, "pack"), (True, "trim")])
def test_compute_values_matches_plain_forward(critic_dir, rmpad, mode, monkeypatch):
    monkeypatch.setenv("VERL_REMOVE_PADDING_MODE", mode)
    model = _critic(critic_dir)
    b = make_batch(5, 6, 4, seed=1)
    critic = DataParallelPPOCritic(critic_config(model={"use_remove_padding": rmpad}), model)
    values = critic.compute_values(DataProto.from_dict(b))
    mask = b["response_mask"]
    expect = torch.zeros_like(values)
    with torch.no_grad():
        for i in range(5):
            keep = b["attention_mask"][i].bool()
            v = model(input_ids=b["input_ids"][i][keep].unsqueeze(0)).logits[0, :, 0]
            n = int(mask[i].sum())
            expect[i, :n] = v[-n - 1 : -1]
    assert (values - expect).abs().max() < 1e-5
    assert torch.all(values[mask == 0] == 0) and values.abs().sum() > 0


def test_value_loss_clipping_reported(critic_dir):
    model = _critic(critic_dir)
    b = make_batch(4, 6, 4, seed=2)
    b["values"] = b["values"] + 5.0  # far from the predictions: the clipped branch is active
    cfg = critic_config(cliprange_value=0.1)
    critic = DataParallelPPOCritic(cfg, model, build_optimizer(model.parameters(), typed_critic_config(cfg).optim))
    m = critic.update_critic(DataProto.from_dict(b))
    assert set(m) == {"critic/vf_loss", "critic/vf_clipfrac", "critic/vpred_mean", "critic/grad_norm"}
    assert min(m["critic/vf_clipfrac"]) > 0.5 and len(m["critic/grad_norm"]) == 1


def _critic_worker(rank, world, out_dir, path, batch, cfg_dict):
    from omegaconf import OmegaConf

    from verl.utils.fsdp_utils import apply_fsdp2, get_full_state_dict

    cfg = OmegaConf.create(cfg_dict)
    model = _critic(path)
    apply_fsdp2(model, omega_conf_to_dataclass(cfg.fsdp_config, FSDPEngineConfig))
    critic = DataParallelPPOCritic(cfg, model, build_optimizer(model.parameters(), typed_critic_config(cfg).optim))
    mine = {k: v[rank * 4 : rank * 4 + 4] for k, v in batch.items()}
    metrics = critic.update_critic(DataProto.from_dict(copy.deepcopy(mine)))
    state = get_full_state_dict(model)
    if rank == 0:
        torch.save({"state": state, "metrics": metrics}, f"{out_dir}/critic.pt")


@pytest.mark.e2e
def test_two_ranks_match_single_process(critic_dir, tmp_path):
    from omegaconf import OmegaConf

    batch = make_batch(8, 6, 4, seed=3)
    # lr 1e-3: Adam's first step is ~lr * sign(g), so fp32 round-off on near-zero gradients shows up as ~lr * 1e-3
    ref_cfg = critic_config(ppo_mini_batch_size=8, ppo_micro_batch_size_per_gpu=3, optim={"lr": 1e-3})
    ref_model = _critic(critic_dir)
    ref_optim = build_optimizer(ref_model.parameters(), typed_critic_config(ref_cfg).optim)
    ref = DataParallelPPOCritic(ref_cfg, ref_model, ref_optim)
    ref_metrics = ref.update_critic(DataProto.from_dict(copy.deepcopy(batch)))
    cfg = critic_config(ppo_mini_batch_size=4, use_dynamic_bsz=True, ppo_max_token_len_per_gpu=12,
                        model={"use_remove_padding": True}, optim={"lr": 1e-3})
    run_distributed(_critic_worker, 2, str(tmp_path), critic_dir, batch, OmegaConf.to_container(cfg),
                    err_dir=str(tmp_path))
    got = torch.load(tmp_path / "critic.pt", weights_only=False)
    for k, v in ref_model.state_dict().items():
        assert torch.allclose(got["state"][k], v, atol=1e-5, rtol=0), (k, (got["state"][k] - v).abs().max())
    assert abs(got["metrics"]["critic/grad_norm"][0] - ref_metrics["critic/grad_norm"][0]) < 1e-4
