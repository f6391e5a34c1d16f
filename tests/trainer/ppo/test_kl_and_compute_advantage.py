"""KL estimators, KL controllers, apply_kl_penalty and compute_advantage (on a DataProto)."""

import math
import random

import numpy as np
import pytest
import torch
from ppo_refs import make_batch, masked_avg, rows, tolist

from verl.trainer.config_schema.ppo import AlgorithmConfig, KLCtrlConfig
from verl.trainer.ppo import core_algos as ca
from verl.utils.config import omega_conf_to_dataclass


def logprob_pair(seed=0, B=4, L=6, spread=2.0):
    rng = random.Random(seed)
    lp = torch.tensor([[-abs(rng.gauss(1, 1)) for _ in range(L)] for _ in range(B)], dtype=torch.float64)
    ref = lp + torch.tensor([[rng.gauss(0, spread) for _ in range(L)] for _ in range(B)], dtype=torch.float64)
    return lp, ref


def k3_ref(x, y):
    d = min(max(y - x, -20.0), 20.0)
    return min(max(math.exp(d) - d - 1, -10.0), 10.0)


REFS = {
    "kl": lambda x, y: x - y,
    "k1": lambda x, y: x - y,
    "abs": lambda x, y: abs(x - y),
    "mse": lambda x, y: 0.5 * (x - y) ** 2,
    "k2": lambda x, y: 0.5 * (x - y) ** 2,
    "low_var_kl": k3_ref,
    "k3": k3_ref,
}


@pytest.mark.parametrize("name", sorted(REFS))
def test_kl_estimators_match_hand_computation(name):
    lp, ref = logprob_pair(seed=1, spread=4.0)  # large spread exercises the k3 clamp at 10
    out = ca.kl_penalty(lp, ref, name)
    a, b = tolist(lp), tolist(ref)
    expected = [[REFS[name](x, y) for x, y in zip(ra, rb)] for ra, rb in zip(a, b)]
    np.testing.assert_allclose(out.numpy(), np.asarray(expected), rtol=1e-12, atol=1e-12)
    if name in ("low_var_kl", "k3"):
        assert out.max().item() == 10.0 and out.min().item() >= 0


def test_k3_is_unbiased_estimate_of_kl():
    """E_{x~p}[k1] = E_{x~p}[k3] = KL(p||q) for categorical p, q."""
    torch.manual_seed(0)
    p = torch.softmax(0.5 * torch.randn(5, dtype=torch.float64), -1)
    q = torch.softmax(0.5 * torch.randn(5, dtype=torch.float64), -1)
    exact = (p * (p.log() - q.log())).sum().item()
    lp, lq = p.log(), q.log()
    for name in ("k1", "k3"):
        assert (p * ca.kl_penalty(lp, lq, name)).sum().item() == pytest.approx(exact, abs=1e-12)


def test_full_kl_needs_vocab_logprobs():
    torch.manual_seed(0)
    lp = torch.log_softmax(torch.randn(2, 3, 5, dtype=torch.float64), -1)
    lq = torch.log_softmax(torch.randn(2, 3, 5, dtype=torch.float64), -1)
    out = ca.kl_penalty(lp, lq, "full")
    assert out.shape == (2, 3)
    p, q = lp.exp().tolist(), lq.exp().tolist()
    for i in range(2):
        for t in range(3):
            exact = sum(pv * math.log(pv / qv) for pv, qv in zip(p[i][t], q[i][t]))
            assert out[i, t].item() == pytest.approx(exact, abs=1e-12)
    with pytest.raises(ValueError, match="full-vocabulary"):
        ca.kl_penalty(lp[..., 0], lq[..., 0], "full")


def test_unknown_kl_lists_choices():
    with pytest.raises(ValueError) as err:
        ca.kl_penalty(torch.zeros(1), torch.zeros(1), "k4")
    assert all(n in str(err.value) for n in ("k1", "low_var_kl", "mse", "full"))


def test_straight_through_plus_variant():
    lp, ref = logprob_pair(seed=2, spread=0.5)
    lp.requires_grad_(True)
    out = ca.kl_penalty(lp, ref, "k3+")
    assert torch.allclose(out, ca.kl_penalty(lp.detach(), ref, "k3"))
    out.sum().backward()
    assert torch.allclose(lp.grad, (lp - ref).detach())  # gradient of 0.5 (log r)^2


def test_adaptive_kl_controller_hand_computation():
    ctrl = ca.AdaptiveKLController(init_kl_coef=0.2, target_kl=0.1, horizon=100)
    ctrl.update(current_kl=0.11, n_steps=10)  # error 0.1
    assert ctrl.value == pytest.approx(0.2 * (1 + 0.1 * 10 / 100))
    v = ctrl.value
    ctrl.update(current_kl=5.0, n_steps=10)  # error clipped to +0.2
    assert ctrl.value == pytest.approx(v * 1.02)
    v = ctrl.value
    ctrl.update(current_kl=0.0, n_steps=50)  # clipped to -0.2
    assert ctrl.value == pytest.approx(v * 0.9)
    with pytest.raises(ValueError, match="horizon"):
        ca.AdaptiveKLController(0.1, 0.1, 0)


def test_get_kl_controller_from_configs():
    from omegaconf import OmegaConf

    node = OmegaConf.create({"type": "fixed", "kl_coef": 0.05, "horizon": 10, "target_kl": 0.1})
    fixed = ca.get_kl_controller(omega_conf_to_dataclass(node, KLCtrlConfig))  # algorithm.kl_ctrl, typed
    assert isinstance(fixed, ca.FixedKLController) and fixed.value == 0.05
    fixed.update(1.0, 100)
    assert fixed.value == 0.05
    adaptive = ca.get_kl_controller(KLCtrlConfig(type="adaptive", kl_coef=0.3, horizon=20, target_kl=0.2))
    assert isinstance(adaptive, ca.AdaptiveKLController)
    assert (adaptive.value, adaptive.target, adaptive.horizon) == (0.3, 0.2, 20)
    with pytest.raises(ValueError, match="fixed"):
        ca.get_kl_controller(KLCtrlConfig(type="pid"))


# ------------------------------------------------------------------------------------------------ DataProto steps
def make_proto(layout=(2, 3), seed=0, prompt_len=3):
    from verl.protocol import DataProto

    rewards, mask, uids, values = make_batch(list(layout), seed=seed, sparse_reward=False)
    B, L = rewards.shape
    attention = torch.cat([torch.ones(B, prompt_len, dtype=torch.long), mask.long()], dim=-1)
    lp, ref = logprob_pair(seed=seed, B=B, L=L, spread=0.3)
    tensors = {
        "responses": torch.zeros(B, L, dtype=torch.long),
        "attention_mask": attention,
        "token_level_scores": rewards.clone(),
        "token_level_rewards": rewards.clone(),
        "values": values,
        "old_log_probs": lp,
        "ref_log_prob": ref,
        "reward_baselines": torch.full((B,), 0.25, dtype=torch.float64),
    }
    return DataProto.from_dict(tensors=tensors, non_tensors={"uid": uids}), rewards, mask, uids, values


def test_apply_kl_penalty_rewards_and_metrics():
    data, scores, mask, _, _ = make_proto(seed=3)
    ctrl = ca.AdaptiveKLController(init_kl_coef=0.5, target_kl=0.01, horizon=1000)
    data, metrics = ca.apply_kl_penalty(data, ctrl, kl_penalty="kl")
    lp, ref = tolist(data.batch["old_log_probs"]), tolist(data.batch["ref_log_prob"])
    s = tolist(scores)
    seq_kls = []
    for i, valid in enumerate(rows(mask)):
        for t in range(mask.shape[1]):
            kl = lp[i][t] - ref[i][t] if t in valid else 0.0
            assert data.batch["token_level_rewards"][i, t].item() == pytest.approx(s[i][t] - 0.5 * kl, abs=1e-12)
        seq_kls.append(sum(lp[i][t] - ref[i][t] for t in valid) / len(valid))
    mean_kl = sum(seq_kls) / len(seq_kls)
    assert metrics["actor/reward_kl_penalty"] == pytest.approx(mean_kl, abs=1e-9)
    assert metrics["actor/reward_kl_penalty_coeff"] == 0.5
    error = max(-0.2, min(0.2, mean_kl / 0.01 - 1))
    assert ctrl.value == pytest.approx(0.5 * (1 + error * len(seq_kls) / 1000))
    assert "response_mask" in data.batch.keys()  # derived from attention_mask


@pytest.mark.parametrize("estimator", [e.value for e in ca.AdvantageEstimator])
def test_compute_advantage_dispatches_to_registry(estimator):
    data, rewards, mask, uids, values = make_proto(layout=(2, 3, 4), seed=5)
    cfg = AlgorithmConfig(gamma=0.9, lam=0.8, norm_adv_by_std_in_grpo=True)
    out = ca.compute_advantage(data, adv_estimator=estimator, gamma=0.9, lam=0.8, config=cfg)
    assert torch.equal(out.batch["response_mask"], mask.long())
    fn = ca.get_adv_estimator_fn(estimator)
    direct = {
        "gae": lambda: fn(rewards, values, mask, gamma=0.9, lam=0.8),
        "remax": lambda: fn(rewards, torch.full((len(uids),), 0.25, dtype=torch.float64), mask),
        "reinforce_plus_plus": lambda: fn(rewards, mask, gamma=0.9),
    }.get(estimator, lambda: fn(rewards, mask, uids))()
    assert torch.allclose(out.batch["advantages"], direct[0].to(out.batch["advantages"].dtype))
    assert torch.allclose(out.batch["returns"], direct[1].to(out.batch["returns"].dtype))


def test_compute_advantage_grpo_norm_flag_and_errors():
    data, rewards, mask, uids, _ = make_proto(layout=(3, 3), seed=6)
    out = ca.compute_advantage(data, ca.AdvantageEstimator.GRPO, norm_adv_by_std_in_grpo=False)
    dr, _ = ca.compute_grpo_outcome_advantage(rewards, mask, uids, norm_adv_by_std_in_grpo=False)
    assert torch.allclose(out.batch["advantages"], dr)
    with pytest.raises(ValueError, match="registered"):
        ca.compute_advantage(data, "nope")
    data.pop(non_tensor_batch_keys=["uid"])
    with pytest.raises(ValueError, match="uid"):
        ca.compute_advantage(data, "rloo")


def test_pf_ppo_resamples_batch_with_gae():
    torch.manual_seed(0)
    data, *_ = make_proto(layout=(4, 4), seed=7)
    n = len(data)
    cfg = omega_conf_to_dataclass({"use_pf_ppo": True, "pf_ppo": {"reweight_method": "max_min"}}, AlgorithmConfig)
    out = ca.compute_advantage(data, "gae", config=cfg)
    assert len(out) == n
    scores = out.batch["token_level_scores"].sum(-1)
    original = data.batch["token_level_scores"].sum(-1)
    # max_min keeps only the best and worst responses
    assert set(scores.tolist()) <= {original.max().item(), original.min().item()}
    assert "advantages" in out.batch.keys() and out.batch["advantages"].shape == data.batch["advantages"].shape


def test_compute_rewards_k1_shaping():
    lp, ref = logprob_pair(seed=9)
    scores = torch.ones_like(lp)
    out = ca.compute_rewards(scores, lp, ref, kl_ratio=0.3)
    a, b = tolist(lp), tolist(ref)
    for i in range(lp.shape[0]):
        for t in range(lp.shape[1]):
            assert out[i, t].item() == pytest.approx(1.0 - 0.3 * (a[i][t] - b[i][t]), abs=1e-12)


def test_every_public_name_importable_from_core_algos():
    import verl.trainer.ppo.core_algos as mod

    for name in mod.__all__:
        assert hasattr(mod, name), name
    from verl.trainer.ppo.core_algos import (  # noqa: F401
        ADV_ESTIMATOR_REGISTRY, POLICY_LOSS_REGISTRY, AdaptiveKLController, AdvantageEstimator, FixedKLController,
        agg_loss, apply_kl_penalty, compute_advantage, compute_entropy_loss, compute_gae_advantage_return,
        compute_gpg_outcome_advantage, compute_grpo_outcome_advantage, compute_grpo_passk_outcome_advantage,
        compute_opo_outcome_advantage, compute_policy_loss, compute_reinforce_plus_plus_baseline_outcome_advantage,
        compute_reinforce_plus_plus_outcome_advantage, compute_remax_outcome_advantage, compute_rloo_outcome_advantage,
        compute_value_loss, get_adv_estimator_fn, get_kl_controller, get_policy_loss_fn, kl_penalty, register_adv_est,
        register_policy_loss)
