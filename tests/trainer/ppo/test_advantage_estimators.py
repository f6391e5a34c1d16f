"""Advantage estimators vs float64 hand computations (python loops), plus properties."""

import math

import numpy as np
import pytest
import torch
from ppo_refs import broadcast, groups, make_batch, mean, rows, std_unbiased, tolist, whiten_valid

from verl.trainer.config_schema.ppo import AlgorithmConfig
from verl.trainer.ppo import core_algos as ca

GROUP_LAYOUTS = [[1, 2, 3, 5], [4, 4, 4], [1, 1, 1], [8], [2, 1, 6, 3, 2]]


def assert_close(actual, expected, tol=1e-9):
    np.testing.assert_allclose(np.asarray(tolist(actual) if torch.is_tensor(actual) else actual),
                               np.asarray(expected), rtol=tol, atol=tol)


def seq_scores(rewards):
    return [sum(r) for r in tolist(rewards)]


# ------------------------------------------------------------------------------------------------ registry
def test_registry_has_every_estimator_and_enum_lookup():
    names = {e.value for e in ca.AdvantageEstimator}
    assert names == {"gae", "grpo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "remax", "rloo", "opo",
                     "grpo_passk", "gpg", "rloo_vectorized", "grpo_vectorized"}
    for e in ca.AdvantageEstimator:
        assert ca.get_adv_estimator_fn(e) is ca.get_adv_estimator_fn(e.value) is ca.ADV_ESTIMATOR_REGISTRY[e.value]
    assert ca.get_adv_estimator_fn("grpo") is ca.compute_grpo_outcome_advantage
    assert ca.AdvantageEstimator("rloo") == "rloo"


def test_unknown_estimator_lists_choices():
    with pytest.raises(ValueError) as err:
        ca.get_adv_estimator_fn("grpoo")
    for name in ("gae", "grpo", "rloo", "remax"):
        assert name in str(err.value)


def test_register_custom_estimator_and_conflict():
    @ca.register_adv_est("unit_test_const")
    def const(token_level_rewards, response_mask, **kwargs):
        return response_mask * 1.0, response_mask * 1.0

    try:
        assert ca.get_adv_estimator_fn("unit_test_const") is const
        with pytest.raises(ValueError):
            ca.register_adv_est("unit_test_const")(lambda **k: None)
    finally:
        ca.ADV_ESTIMATOR_REGISTRY.pop("unit_test_const")


# ------------------------------------------------------------------------------------------------ GAE
def ref_gae(rewards, values, mask, gamma, lam):
    r, v = tolist(rewards), tolist(values)
    B, L = mask.shape
    adv = [[0.0] * L for _ in range(B)]
    for i, valid in enumerate(rows(mask)):
        next_v, next_a = 0.0, 0.0
        for t in reversed(valid):
            delta = r[i][t] + gamma * next_v - v[i][t]
            next_a = delta + gamma * lam * next_a
            next_v = v[i][t]
            adv[i][t] = next_a
    ret = [[adv[i][t] + v[i][t] if mask[i, t] > 0 else 0.0 for t in range(L)] for i in range(B)]
    return whiten_valid(adv, mask), ret


@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (0.9, 0.95), (0.5, 0.0)])
@pytest.mark.parametrize("seed", [0, 1])
def test_gae_matches_hand_computation(gamma, lam, seed):
    rewards, mask, _, values = make_batch([3, 2, 4], seed=seed, sparse_reward=False)
    adv, ret = ca.compute_gae_advantage_return(rewards, values, mask, gamma=gamma, lam=lam)
    ref_adv, ref_ret = ref_gae(rewards, values, mask, gamma, lam)
    assert_close(adv, ref_adv, 1e-7)
    assert_close(ret, ref_ret)


def test_gae_skips_masked_tokens_inside_response():
    """Multi-turn: masked (observation) tokens in the middle are skipped by the recursion."""
    rewards, _, _, values = make_batch([4], max_len=8, seed=3, sparse_reward=False)
    mask = torch.tensor([[1, 1, 0, 0, 1, 1, 1, 0]] * 2 + [[1, 0, 1, 0, 1, 0, 1, 1]] * 2, dtype=torch.float64)
    adv, ret = ca.compute_gae_advantage_return(rewards, values, mask, gamma=0.9, lam=0.8)
    ref_adv, ref_ret = ref_gae(rewards, values, mask, 0.9, 0.8)
    assert_close(adv, ref_adv, 1e-7)
    assert_close(ret, ref_ret)


def test_gae_lambda1_gamma1_returns_are_reward_to_go():
    rewards, mask, _, values = make_batch([5], seed=4, sparse_reward=False)
    _, ret = ca.compute_gae_advantage_return(rewards, values, mask, gamma=1.0, lam=1.0)
    r = tolist(rewards)
    for i, valid in enumerate(rows(mask)):
        for t in valid:
            assert ret[i, t].item() == pytest.approx(sum(r[i][u] for u in valid if u >= t), abs=1e-9)


# ------------------------------------------------------------------------------------------------ GRPO family
def ref_grpo(rewards, mask, uids, eps=1e-6, norm=True):
    s = seq_scores(rewards)
    out = [0.0] * len(s)
    for members in groups(uids).values():
        xs = [s[i] for i in members]
        m, sd = (0.0, 1.0) if len(xs) == 1 else (mean(xs), std_unbiased(xs))
        for i in members:
            out[i] = (s[i] - m) / (sd + eps) if norm else s[i] - m
    return broadcast(out, mask)


@pytest.mark.parametrize("layout", GROUP_LAYOUTS)
@pytest.mark.parametrize("norm", [True, False])
def test_grpo_matches_hand_computation(layout, norm):
    rewards, mask, uids, _ = make_batch(layout, seed=len(layout), sparse_reward=False)
    adv, ret = ca.compute_grpo_outcome_advantage(rewards, mask, uids, norm_adv_by_std_in_grpo=norm)
    assert_close(adv, ref_grpo(rewards, mask, uids, norm=norm), 1e-8)
    assert torch.equal(adv, ret)


def test_grpo_properties():
    rewards, mask, uids, _ = make_batch([4, 4, 4], seed=9, sparse_reward=False)
    adv, _ = ca.compute_grpo_outcome_advantage(rewards, mask, uids)
    per_seq = adv.sum(-1) / mask.sum(-1)
    for members in groups(uids).values():
        group_adv = per_seq[members]
        assert group_adv.sum().item() == pytest.approx(0.0, abs=1e-9)  # zero-mean per group
        assert group_adv.std().item() == pytest.approx(1.0, abs=1e-5)  # unit std per group
    assert torch.all(adv[mask == 0] == 0)
    # constant within each response
    for i, valid in enumerate(rows(mask)):
        assert len({round(adv[i, t].item(), 12) for t in valid}) == 1
    # identical scores in a group -> zero advantage (no NaN)
    same = torch.zeros(3, 4, dtype=torch.float64)
    same[:, -1] = 1.0
    a, _ = ca.compute_grpo_outcome_advantage(same, torch.ones(3, 4), np.array(["u"] * 3, dtype=object))
    assert torch.all(a == 0)


@pytest.mark.parametrize("layout", GROUP_LAYOUTS)
@pytest.mark.parametrize("eps", [1e-6, 0.5])
def test_dr_grpo_differs_from_grpo_only_by_std_scaling(layout, eps):
    """Dr.GRPO (norm_adv_by_std_in_grpo=False) keeps the group-mean baseline and drops only the division by
    the group's std: per group, adv_grpo == adv_dr / (std + eps) (std := 1 for a singleton group)."""
    rewards, mask, uids, _ = make_batch(layout, seed=sum(layout), sparse_reward=False)
    adv, _ = ca.compute_grpo_outcome_advantage(rewards, mask, uids, epsilon=eps, norm_adv_by_std_in_grpo=True)
    adv_dr, _ = ca.compute_grpo_outcome_advantage(rewards, mask, uids, epsilon=eps, norm_adv_by_std_in_grpo=False)
    scores = torch.tensor(seq_scores(rewards), dtype=torch.float64)
    for members in groups(uids).values():
        std = scores[members].std().item() if len(members) > 1 else 1.0
        torch.testing.assert_close(adv[members], adv_dr[members] / (std + eps), rtol=1e-9, atol=1e-12)
    assert not torch.equal(adv, adv_dr)  # the scaling is not a no-op on this data


def test_grpo_accepts_tensor_and_int_uids():
    rewards, mask, uids, _ = make_batch([2, 3], seed=2)
    ids = {u: k for k, u in enumerate(sorted(set(uids)))}
    as_tensor = torch.tensor([ids[u] for u in uids])
    a1, _ = ca.compute_grpo_outcome_advantage(rewards, mask, uids)
    a2, _ = ca.compute_grpo_outcome_advantage(rewards, mask, as_tensor)
    a3, _ = ca.compute_grpo_outcome_advantage(rewards, mask, np.array([ids[u] for u in uids]))
    assert torch.allclose(a1, a2) and torch.allclose(a1, a3)


def ref_passk(rewards, mask, uids, eps=1e-6, norm=True):
    s = seq_scores(rewards)
    out = [0.0] * len(s)
    for members in groups(uids).values():
        ranked = sorted(members, key=lambda i: (-s[i], i))
        gap = s[ranked[0]] - s[ranked[1]]
        if norm:
            gap /= std_unbiased([s[i] for i in members]) + eps
        out[ranked[0]] = gap
    return broadcast(out, mask)


@pytest.mark.parametrize("layout", [[2, 3, 5], [4, 4], [2, 2, 2, 2]])
@pytest.mark.parametrize("norm", [True, False])
def test_grpo_passk_matches_hand_computation(layout, norm):
    rewards, mask, uids, _ = make_batch(layout, seed=7 + len(layout), sparse_reward=False)
    adv, _ = ca.compute_grpo_passk_outcome_advantage(rewards, mask, uids, norm_adv_by_std_in_grpo=norm)
    assert_close(adv, ref_passk(rewards, mask, uids, norm=norm), 1e-8)
    # config overrides the keyword, as in verl
    cfg = AlgorithmConfig(norm_adv_by_std_in_grpo=norm)
    adv2, _ = ca.compute_grpo_passk_outcome_advantage(rewards, mask, uids, config=cfg)
    assert torch.allclose(adv, adv2)
    # only one response per group is non-zero
    nonzero_rows = (adv.abs().sum(-1) > 0).tolist()
    for members in groups(uids).values():
        assert sum(nonzero_rows[i] for i in members) <= 1


def test_grpo_passk_rejects_singletons():
    rewards, mask, uids, _ = make_batch([1, 3], seed=1)
    with pytest.raises(ValueError, match="at least 2"):
        ca.compute_grpo_passk_outcome_advantage(rewards, mask, uids)


def ref_rloo(rewards, mask, uids):
    s = seq_scores(rewards)
    out = [0.0] * len(s)
    for members in groups(uids).values():
        for i in members:
            others = [s[j] for j in members if j != i]
            out[i] = s[i] - mean(others) if others else s[i]
    return broadcast(out, mask)


@pytest.mark.parametrize("layout", GROUP_LAYOUTS)
def test_rloo_matches_hand_computation(layout):
    rewards, mask, uids, _ = make_batch(layout, seed=11, sparse_reward=False)
    adv, ret = ca.compute_rloo_outcome_advantage(rewards, mask, uids)
    assert_close(adv, ref_rloo(rewards, mask, uids))
    assert torch.equal(adv, ret)


def ref_opo(rewards, mask, uids):
    s = seq_scores(rewards)
    lens = [len(v) for v in rows(mask)]
    out = [0.0] * len(s)
    for members in groups(uids).values():
        b = 0.0 if len(members) == 1 else sum(lens[j] * s[j] for j in members) / sum(lens[j] for j in members)
        for i in members:
            out[i] = s[i] - b
    return broadcast(out, mask)


@pytest.mark.parametrize("layout", GROUP_LAYOUTS)
def test_opo_matches_hand_computation(layout):
    rewards, mask, uids, _ = make_batch(layout, seed=12, sparse_reward=False)
    adv, _ = ca.compute_opo_outcome_advantage(rewards, mask, uids)
    assert_close(adv, ref_opo(rewards, mask, uids))


def test_opo_equal_lengths_equals_group_mean_baseline():
    rewards, _, uids, _ = make_batch([3, 3], seed=5, sparse_reward=False)
    mask = torch.ones_like(rewards)
    a_opo, _ = ca.compute_opo_outcome_advantage(rewards, mask, uids)
    a_grpo, _ = ca.compute_grpo_outcome_advantage(rewards, mask, uids, norm_adv_by_std_in_grpo=False)
    assert torch.allclose(a_opo, a_grpo)


def ref_rpp_baseline(rewards, mask, uids):
    s = seq_scores(rewards)
    out = [0.0] * len(s)
    for members in groups(uids).values():
        m = 0.0 if len(members) == 1 else mean([s[i] for i in members])
        for i in members:
            out[i] = s[i] - m
    return whiten_valid(broadcast(out, mask), mask)


@pytest.mark.parametrize("layout", GROUP_LAYOUTS[:3] + [[2, 1, 6, 3, 2]])
def test_reinforce_pp_baseline_matches_hand_computation(layout):
    rewards, mask, uids, _ = make_batch(layout, seed=13, sparse_reward=False)
    adv, _ = ca.compute_reinforce_plus_plus_baseline_outcome_advantage(rewards, mask, uids)
    assert_close(adv, ref_rpp_baseline(rewards, mask, uids), 1e-7)


def ref_gpg(rewards, mask, uids):
    s = seq_scores(rewards)
    alpha = len(s) / max(1, sum(1 for x in s if x != 0))
    out = [0.0] * len(s)
    for members in groups(uids).values():
        m = 0.0 if len(members) == 1 else mean([s[i] for i in members])
        for i in members:
            out[i] = alpha * (s[i] - m)
    return broadcast(out, mask)


@pytest.mark.parametrize("layout", GROUP_LAYOUTS)
def test_gpg_matches_hand_computation(layout):
    rewards, mask, uids, _ = make_batch(layout, seed=14)  # sparse: some scores are exactly 0
    adv, _ = ca.compute_gpg_outcome_advantage(rewards, mask, uids)
    assert_close(adv, ref_gpg(rewards, mask, uids))


# ------------------------------------------------------------------------------------------------ REINFORCE++ / ReMax
def ref_rpp(rewards, mask, gamma):
    r = tolist(rewards)
    B, L = mask.shape
    ret = [[0.0] * L for _ in range(B)]
    for i, valid in enumerate(rows(mask)):
        for t in valid:
            ret[i][t] = sum(gamma ** (u - t) * r[i][u] for u in valid if u >= t)
    return whiten_valid(ret, mask), ret


@pytest.mark.parametrize("gamma", [1.0, 0.9])
def test_reinforce_pp_matches_hand_computation(gamma):
    rewards, mask, _, _ = make_batch([3, 4, 2], seed=15, sparse_reward=False)
    adv, ret = ca.compute_reinforce_plus_plus_outcome_advantage(rewards, mask, gamma=gamma)
    ref_adv, ref_ret = ref_rpp(rewards, mask, gamma)
    assert_close(adv, ref_adv, 1e-7)
    assert_close(ret, ref_ret)
    # gamma read from the algorithm config when not given
    adv_cfg, _ = ca.compute_reinforce_plus_plus_outcome_advantage(rewards, mask, config=AlgorithmConfig(gamma=gamma))
    assert torch.allclose(adv, adv_cfg)
    with pytest.raises(ValueError, match="gamma"):
        ca.compute_reinforce_plus_plus_outcome_advantage(rewards, mask)


def test_remax_matches_hand_computation():
    rewards, mask, _, _ = make_batch([3, 4], seed=16, sparse_reward=False)
    baselines = torch.linspace(-1, 1, rewards.shape[0], dtype=torch.float64)
    adv, ret = ca.compute_remax_outcome_advantage(rewards, baselines, mask)
    r = tolist(rewards)
    for i, valid in enumerate(rows(mask)):
        for t in range(mask.shape[1]):
            g = sum(r[i][u] for u in valid if u >= t) if t in valid else 0.0
            assert ret[i, t].item() == pytest.approx(g, abs=1e-9)
            expected = g - baselines[i].item() if t in valid else 0.0
            assert adv[i, t].item() == pytest.approx(expected, abs=1e-9)


@pytest.mark.parametrize("name", [e.value for e in ca.AdvantageEstimator])
def test_every_estimator_zero_on_padding_and_finite(name):
    rewards, mask, uids, values = make_batch([2, 3, 4], seed=21, sparse_reward=False)
    fn = ca.get_adv_estimator_fn(name)
    kwargs = dict(token_level_rewards=rewards, response_mask=mask, index=uids, values=values, gamma=0.99, lam=0.95,
                  reward_baselines=torch.zeros(len(uids), dtype=torch.float64), config=None)
    adv, ret = fn(**kwargs)
    assert adv.shape == rewards.shape and ret.shape == rewards.shape
    assert torch.isfinite(adv).all() and torch.isfinite(ret).all()
    assert torch.all(adv[mask == 0] == 0)
    assert not adv.requires_grad and math.isfinite(adv.abs().max().item())
