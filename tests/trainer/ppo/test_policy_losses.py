"""Policy losses, agg_loss, entropy and value losses vs float64 hand computations, plus gradient properties."""

import math
import random

import numpy as np
import pytest
import torch
from ppo_refs import agg, masked_avg, rows, tolist

from verl.trainer.ppo import core_algos as ca
from verl.utils.config import ConfigError, omega_conf_to_dataclass
from verl.workers.config import FSDPActorConfig

MODES = ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]


def actor(**keys):
    """The typed actor config the losses read (keys not given take the schema's defaults)."""
    return omega_conf_to_dataclass(keys, FSDPActorConfig)


def make_pg(seed=0, B=6, L=8, spread=0.6, seq_adv=False):
    """old/new log-probs with ratios spread well outside the clip range, advantages of both signs, padding."""
    rng = random.Random(seed)
    old = torch.tensor([[-abs(rng.gauss(1.0, 0.7)) for _ in range(L)] for _ in range(B)], dtype=torch.float64)
    new = old + torch.tensor([[rng.gauss(0, spread) for _ in range(L)] for _ in range(B)], dtype=torch.float64)
    if seq_adv:
        adv = torch.tensor([[a] * L for a in [rng.gauss(0, 1) for _ in range(B)]], dtype=torch.float64)
    else:
        adv = torch.tensor([[rng.gauss(0, 1) for _ in range(L)] for _ in range(B)], dtype=torch.float64)
    mask = torch.zeros(B, L, dtype=torch.float64)
    for i in range(B):
        mask[i, : L if i == 0 else rng.randint(1, L)] = 1
    return old, new.requires_grad_(True), adv, mask


def close(a, b, tol=1e-7):
    a = a.detach() if torch.is_tensor(a) else a
    b = b.detach() if torch.is_tensor(b) else b
    return abs(float(a) - float(b)) <= tol * max(1.0, abs(float(b)))


# ------------------------------------------------------------------------------------------------ agg_loss
@pytest.mark.parametrize("mode", MODES)
def test_agg_loss_matches_hand_computation(mode):
    _, _, loss, mask = make_pg(seed=1)
    assert close(ca.agg_loss(loss, mask, mode), agg(tolist(loss), mask, mode))


def test_agg_loss_modes_differ_and_ignore_padding():
    _, _, loss, mask = make_pg(seed=2)
    values = {m: ca.agg_loss(loss, mask, m).item() for m in MODES}
    assert len({round(v, 10) for v in values.values()}) == 4
    garbage = loss.clone()
    garbage[mask == 0] = float("nan")
    for m in MODES:
        assert ca.agg_loss(garbage, mask, m).item() == pytest.approx(values[m], abs=1e-12)


@pytest.mark.parametrize("mode", MODES)
def test_agg_loss_ignores_fully_masked_rows(mode):
    _, _, loss, mask = make_pg(seed=3)
    mask[2] = 0  # e.g. a padding row added to balance data-parallel ranks
    loss_nan = loss.clone()
    loss_nan[2] = float("nan")
    expected = agg(tolist(loss), mask, mode)
    assert close(ca.agg_loss(loss_nan, mask, mode), expected)
    keep = [i for i in range(mask.shape[0]) if i != 2]
    assert close(ca.agg_loss(loss[keep], mask[keep], mode), expected)  # same as dropping the row
    assert ca.agg_loss(loss, torch.zeros_like(mask), mode).item() == 0.0


def test_agg_loss_sum_norm_uses_horizon_and_scale_factor():
    loss = torch.ones(2, 10, dtype=torch.float64)
    mask = torch.zeros(2, 10)
    mask[0, :3], mask[1, :7] = 1, 1
    assert ca.agg_loss(loss, mask, "seq-mean-token-sum-norm").item() == pytest.approx((3 + 7) / 2 / 10)
    assert ca.agg_loss(loss, mask, "seq-mean-token-sum-norm", loss_scale_factor=5).item() == pytest.approx(1.0)


def test_agg_loss_unknown_mode_lists_choices():
    with pytest.raises(ValueError) as err:
        ca.agg_loss(torch.ones(1, 2), torch.ones(1, 2), "token_mean")
    assert all(m in str(err.value) for m in MODES)


# ------------------------------------------------------------------------------------------------ vanilla PPO
def ref_ppo(old, new, adv, mask, el, eh, c):
    o, n, a = tolist(old), tolist(new), tolist(adv)
    B, L = mask.shape
    loss = [[0.0] * L for _ in range(B)]
    clipped = [[0.0] * L for _ in range(B)]
    dual = [[0.0] * L for _ in range(B)]
    kl = [[o[i][t] - n[i][t] for t in range(L)] for i in range(B)]
    for i in range(B):
        for t in range(L):
            r = math.exp(n[i][t] - o[i][t])
            l1 = -a[i][t] * r
            l2 = -a[i][t] * min(max(r, 1 - el), 1 + eh)
            lo = max(l1, l2)
            clipped[i][t] = float(l2 > l1)
            if a[i][t] < 0:
                dual[i][t] = float(lo > -a[i][t] * c)
                lo = min(lo, -a[i][t] * c)
            loss[i][t] = lo
    return loss, masked_avg(clipped, mask), masked_avg(kl, mask), masked_avg(dual, mask)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("el,eh,c", [(0.2, 0.2, 3.0), (0.2, 0.28, 3.0), (0.1, 0.3, 1.5)])
def test_compute_policy_loss_matches_hand_computation(mode, el, eh, c):
    old, new, adv, mask = make_pg(seed=3, spread=0.8)
    pg, clipfrac, kl, lower = ca.compute_policy_loss(old, new, adv, mask, cliprange=0.2, cliprange_low=el,
                                                     cliprange_high=eh, clip_ratio_c=c, loss_agg_mode=mode)
    loss, r_clip, r_kl, r_lower = ref_ppo(old, new, adv, mask, el, eh, c)
    assert close(pg, agg(loss, mask, mode))
    assert close(clipfrac, r_clip) and close(kl, r_kl) and close(lower, r_lower)
    assert 0 < r_clip < 1 and r_lower > 0  # the random case exercises both clips


def test_vanilla_registered_reads_actor_config():
    from omegaconf import OmegaConf

    old, new, adv, mask = make_pg(seed=4, spread=0.8)
    node = OmegaConf.create({"clip_ratio": 0.2, "clip_ratio_low": 0.1, "clip_ratio_high": 0.28, "clip_ratio_c": 2.0})
    cfg = omega_conf_to_dataclass(node, FSDPActorConfig)  # as the actor builds it from its yaml section
    out = ca.get_policy_loss_fn("vanilla")(old, new, adv, mask, "token-mean", cfg)
    ref = ca.compute_policy_loss(old, new, adv, mask, cliprange_low=0.1, cliprange_high=0.28, clip_ratio_c=2.0)
    assert all(torch.allclose(x, y) for x, y in zip(out, ref))
    # symmetric clip: clip_ratio_low = clip_ratio_high = clip_ratio
    out2 = ca.get_policy_loss_fn("vanilla")(old, new, adv, mask,
                                            config=actor(clip_ratio=0.3, clip_ratio_low=0.3, clip_ratio_high=0.3))
    assert torch.allclose(out2[0], ca.compute_policy_loss(old, new, adv, mask, cliprange=0.3)[0])
    # the clip ranges are numbers in the typed config: a null is refused, naming the key; the loss needs a config
    with pytest.raises(ConfigError, match="clip_ratio_low"):
        actor(clip_ratio=0.3, clip_ratio_low=None)
    with pytest.raises(ValueError, match="actor config"):
        ca.get_policy_loss_fn("vanilla")(old, new, adv, mask)


def test_vanilla_gradient_is_minus_adv_ratio_where_unclipped():
    old, new, adv, mask = make_pg(seed=5, spread=0.5)
    pg, *_ = ca.compute_policy_loss(old, new, adv, mask, cliprange=0.2, loss_agg_mode="token-mean")
    pg.backward()
    n_valid = mask.sum().item()
    for i, valid in enumerate(rows(mask)):
        for t in valid:
            r = math.exp(new[i, t].item() - old[i, t].item())
            a = adv[i, t].item()
            active = (a > 0 and r < 1.2) or (a < 0 and 0.8 < r < 3.0)
            expected = -a * r / n_valid if active else 0.0
            assert new.grad[i, t].item() == pytest.approx(expected, rel=1e-7, abs=1e-12)


def test_policy_loss_validation_and_is_weights():
    old, new, adv, mask = make_pg(seed=6)
    with pytest.raises(ValueError, match="clip_ratio_c"):
        ca.compute_policy_loss(old, new, adv, mask, cliprange=0.2, clip_ratio_c=1.0)
    w = torch.rand_like(adv)
    pg_w, *_ = ca.compute_policy_loss(old, new, adv, mask, cliprange=0.2, rollout_is_weights=w)
    loss, *_ = ref_ppo(old, new, adv, mask, 0.2, 0.2, 3.0)
    weighted = [[loss[i][t] * w[i, t].item() for t in range(mask.shape[1])] for i in range(mask.shape[0])]
    assert close(pg_w, agg(weighted, mask, "token-mean"))


def test_registry_and_unknown_loss_mode():
    assert set(ca.POLICY_LOSS_REGISTRY) >= {"vanilla", "gspo", "gpg", "clip_cov", "kl_cov", "geo_mean", "cispo"}
    with pytest.raises(ValueError) as err:
        ca.get_policy_loss_fn("vanila")
    assert "vanilla" in str(err.value) and "cispo" in str(err.value)


@pytest.mark.parametrize("name", ["vanilla", "gspo", "gpg", "clip_cov", "kl_cov", "geo_mean", "cispo"])
def test_every_loss_returns_four_finite_scalars_with_gradient(name):
    old, new, adv, mask = make_pg(seed=7)
    out = ca.get_policy_loss_fn(name)(old, new, adv, mask, "token-mean", actor(clip_ratio=0.2))
    assert len(out) == 4
    assert all(torch.is_tensor(x) and x.dim() == 0 and torch.isfinite(x) for x in out)
    out[0].backward()
    assert new.grad is not None and torch.all(new.grad[mask == 0] == 0)
    assert new.grad.abs().sum() > 0


# ------------------------------------------------------------------------------------------------ GSPO
def ref_gspo(old, new, adv, mask, el, eh):
    o, n, a = tolist(old), tolist(new), tolist(adv)
    B, L = mask.shape
    loss = [[0.0] * L for _ in range(B)]
    grad = [[0.0] * L for _ in range(B)]
    for i, valid in enumerate(rows(mask)):
        s = math.exp(sum(n[i][t] - o[i][t] for t in valid) / len(valid))
        for t in valid:
            l1, l2 = -a[i][t] * s, -a[i][t] * min(max(s, 1 - el), 1 + eh)
            loss[i][t] = max(l1, l2)
            if l1 >= l2:  # unclipped branch active: d/dlogp_t of sg[s]*exp(logp - sg[logp]) = s
                grad[i][t] = -a[i][t] * s / len(valid) / B
    return loss, grad


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gspo_matches_hand_computation_and_gradient(seed):
    old, new, adv, mask = make_pg(seed=seed, spread=0.3, seq_adv=True)
    el, eh = 0.05, 0.08
    pg, clipfrac, kl, lower = ca.get_policy_loss_fn("gspo")(
        old, new, adv, mask, "token-mean", actor(clip_ratio_low=el, clip_ratio_high=eh))
    loss, grad = ref_gspo(old, new, adv, mask, el, eh)
    assert close(pg, agg(loss, mask, "seq-mean-token-mean"))  # always sequence-mean-token-mean
    assert close(kl, masked_avg([[-x for x in r] for r in tolist(new - old)], mask))
    assert lower.item() == 0
    pg.backward()
    np.testing.assert_allclose(new.grad.numpy(), np.asarray(grad), atol=1e-12)


def test_gspo_equals_vanilla_on_policy():
    old, _, adv, mask = make_pg(seed=8, seq_adv=True)
    new = old.clone()
    g = ca.get_policy_loss_fn("gspo")(old, new, adv, mask, config=actor(clip_ratio=0.2))[0]
    v = ca.compute_policy_loss(old, new, adv, mask, cliprange=0.2, loss_agg_mode="seq-mean-token-mean")[0]
    assert close(g, v)


# ------------------------------------------------------------------------------------------------ GPG / CISPO
@pytest.mark.parametrize("mode", MODES)
def test_gpg_loss_matches_hand_computation(mode):
    old, new, adv, mask = make_pg(seed=9)
    pg, clipfrac, kl, lower = ca.get_policy_loss_fn("gpg")(old, new, adv, mask, mode)
    n, a = tolist(new), tolist(adv)
    loss = [[-a[i][t] * n[i][t] for t in range(mask.shape[1])] for i in range(mask.shape[0])]
    assert close(pg, agg(loss, mask, mode))
    assert clipfrac.item() == kl.item() == lower.item() == 0


@pytest.mark.parametrize("mode", MODES)
def test_cispo_matches_hand_computation(mode):
    old, new, adv, mask = make_pg(seed=10, spread=0.5)
    el, eh = 0.3, 0.25
    pg, clipfrac, kl, lower = ca.get_policy_loss_fn("cispo")(
        old, new, adv, mask, mode, actor(clip_ratio_low=el, clip_ratio_high=eh))
    o, n, a = tolist(old), tolist(new), tolist(adv)
    B, L = mask.shape
    ratio = [[math.exp(n[i][t] - o[i][t]) for t in range(L)] for i in range(B)]
    loss = [[-min(max(ratio[i][t], 1 - el), 1 + eh) * a[i][t] * n[i][t] for t in range(L)] for i in range(B)]
    assert close(pg, agg(loss, mask, mode))
    assert close(clipfrac, masked_avg([[float(r > 1 + eh) for r in row] for row in ratio], mask))
    assert close(lower, masked_avg([[float(r < 1 - el) for r in row] for row in ratio], mask))
    assert clipfrac > 0 and lower > 0


@pytest.mark.parametrize("mode", MODES)
def test_sapo_matches_hand_computation(mode):
    old, new, adv, mask = make_pg(seed=12, spread=0.5)
    tp, tn = 1.0, 1.05
    pg, clipfrac, kl, lower = ca.get_policy_loss_fn("sapo")(old, new, adv, mask, mode, actor(tau_pos=tp, tau_neg=tn))
    o, n, a = tolist(old), tolist(new), tolist(adv)
    B, L = mask.shape

    def gate(r, tau):
        return 4.0 / tau / (1.0 + math.exp(-tau * (r - 1.0)))

    loss = [[-gate(math.exp(n[i][t] - o[i][t]), tp if a[i][t] > 0 else tn) * a[i][t] for t in range(L)]
            for i in range(B)]
    assert close(pg, agg(loss, mask, mode))
    assert clipfrac.item() == lower.item() == 0
    assert close(kl, masked_avg([[o[i][t] - n[i][t] for t in range(L)] for i in range(B)], mask))


def test_sapo_gradient_equals_the_policy_gradient_at_ratio_one_and_fades_far_from_it():
    # d/d logp of -f(exp(logp - old)) * A at logp = old: f'(1) * A * 1 = A (the gate's slope at 1 is 1)
    old = torch.zeros(1, 3, dtype=torch.float64)
    adv = torch.tensor([[1.0, -2.0, 0.5]], dtype=torch.float64)
    mask = torch.ones_like(adv)
    new = old.clone().requires_grad_(True)
    ca.get_policy_loss_fn("sapo")(old, new, adv, mask, "token-mean", actor(tau_pos=1.0, tau_neg=1.05))[0].backward()
    torch.testing.assert_close(new.grad, -adv / 3)
    far = torch.full((1, 3), 3.0, dtype=torch.float64, requires_grad=True)  # ratio e^3 ~ 20
    ca.get_policy_loss_fn("sapo")(old, far, adv, mask, "token-mean", actor(tau_pos=1.0, tau_neg=1.05))[0].backward()
    assert (far.grad.abs() < 1e-3 * (adv.abs() / 3)).all()  # no hard cut-off, but the gradient has faded


def test_cispo_gradient_matches_ppo_inside_trust_region_and_keeps_clipped_tokens():
    old, new, adv, mask = make_pg(seed=11, spread=0.5)
    cfg = actor(clip_ratio=0.2)
    ca.get_policy_loss_fn("cispo")(old, new, adv, mask, "token-mean", cfg)[0].backward()
    g_cispo = new.grad.clone()
    new.grad = None
    ca.compute_policy_loss(old, new, adv, mask, cliprange=0.2, clip_ratio_c=1e9)[0].backward()
    g_ppo = new.grad.clone()
    ratio = torch.exp(new.detach() - old)
    inside = (ratio > 0.8) & (ratio < 1.2) & (mask > 0)
    outside = ~inside & (mask > 0)
    assert inside.any() and outside.any()
    assert torch.allclose(g_cispo[inside], g_ppo[inside], atol=1e-12)
    assert torch.all(g_cispo[outside] != 0)  # clipped tokens still get (bounded) gradient
    # the weight is a stop-gradient: grad = -clip(r) * A / N exactly
    expected = -torch.clamp(ratio, 0.8, 1.2) * adv * mask / mask.sum()
    assert torch.allclose(g_cispo, expected, atol=1e-12)


# ------------------------------------------------------------------------------------------------ GMPO
@pytest.mark.parametrize("seq_adv", [True, False])
def test_geo_mean_matches_hand_computation(seq_adv):
    old, new, adv, mask = make_pg(seed=12, spread=0.6, seq_adv=seq_adv)
    el, eh = 0.4, 0.3
    pg, clipfrac, kl, lower = ca.get_policy_loss_fn("geo_mean")(
        old, new, adv, mask, "token-mean", actor(clip_ratio_low=el, clip_ratio_high=eh))
    o, n, a = tolist(old), tolist(new), tolist(adv)
    B, L = mask.shape
    seq_losses, clip_pos, clip_neg = [], [[0.0] * L for _ in range(B)], [[0.0] * L for _ in range(B)]
    for i, valid in enumerate(rows(mask)):
        logs = []
        for t in valid:
            lr = n[i][t] - o[i][t]
            lrc = min(max(lr, -el), eh)
            if a[i][t] > 0:
                logs.append(min(lr, lrc))
            elif a[i][t] < 0:
                logs.append(max(lr, lrc))
            else:
                logs.append(0.0)
            if lr != lrc:
                clip_pos[i][t], clip_neg[i][t] = float(a[i][t] > 0), float(a[i][t] < 0)
        R = math.exp(sum(logs) / len(valid))
        A = sum(a[i][t] for t in valid) / len(valid)
        seq_losses.append(-A * R)
    assert close(pg, sum(seq_losses) / B)
    assert close(clipfrac, masked_avg(clip_pos, mask)) and close(lower, masked_avg(clip_neg, mask))
    assert clipfrac > 0 and lower > 0


# ------------------------------------------------------------------------------------------------ Clip-Cov / KL-Cov
def ref_cov(adv, new, mask):
    a, n = tolist(adv), tolist(new)
    a_bar, n_bar = masked_avg(a, mask), masked_avg(n, mask)
    return [[(a[i][t] - a_bar) * (n[i][t] - n_bar) for t in range(mask.shape[1])] for i in range(mask.shape[0])]


def test_clip_cov_with_ratio_one_drops_every_candidate():
    old, new, adv, mask = make_pg(seed=13, spread=0.5)
    cfg = actor(clip_ratio=0.2, policy_loss={"clip_cov_ratio": 1.0, "clip_cov_lb": 0.05, "clip_cov_ub": 0.8})
    pg, clipfrac, kl, lower = ca.get_policy_loss_fn("clip_cov")(old, new, adv, mask, "token-mean", cfg)
    cov = ref_cov(adv, new, mask)
    o, n, a = tolist(old), tolist(new), tolist(adv)
    B, L = mask.shape
    loss, dropped = [[0.0] * L for _ in range(B)], [[0.0] * L for _ in range(B)]
    for i in range(B):
        for t in range(L):
            r = math.exp(n[i][t] - o[i][t])
            l1, l2 = -a[i][t] * r, -a[i][t] * min(max(r, 0.8), 1.2)
            if mask[i, t] > 0 and not l2 > l1 and 0.05 < cov[i][t] < 0.8:
                dropped[i][t] = 1.0
            else:
                loss[i][t] = max(l1, l2)
    assert sum(map(sum, dropped)) > 0
    assert close(pg, agg(loss, mask, "token-mean"))
    assert close(clipfrac, masked_avg(dropped, mask))
    assert lower.item() == 0
    pg.backward()
    for i in range(B):
        for t in range(L):
            if dropped[i][t]:
                assert new.grad[i, t].item() == 0.0


def test_clip_cov_drops_exactly_ratio_times_tokens():
    torch.manual_seed(0)
    old, new, adv, mask = make_pg(seed=14, B=16, L=32, spread=0.3)
    n_valid = int(mask.sum().item())
    cfg = actor(clip_ratio=0.2, policy_loss={"clip_cov_ratio": 0.02, "clip_cov_lb": -10.0, "clip_cov_ub": 10.0})
    _, clipfrac, _, _ = ca.get_policy_loss_fn("clip_cov")(old, new, adv, mask, "token-mean", cfg)
    assert round(clipfrac.item() * n_valid) == max(int(0.02 * n_valid), 1)
    with pytest.raises(ValueError, match="clip_cov_ratio"):
        ca.get_policy_loss_fn("clip_cov")(old, new, adv, mask, config=actor(policy_loss={"clip_cov_ratio": 0.0}))


@pytest.mark.parametrize("ratio_k", [0.2, 1e-4])
def test_kl_cov_matches_hand_computation(ratio_k):
    old, new, adv, mask = make_pg(seed=15, spread=0.4)
    coef = 0.7
    cfg = actor(policy_loss={"kl_cov_ratio": ratio_k, "ppo_kl_coef": coef})
    pg, clipfrac, kl, lower = ca.get_policy_loss_fn("kl_cov")(old, new, adv, mask, "seq-mean-token-mean", cfg)
    cov = ref_cov(adv, new, mask)
    valid = [(cov[i][t], i, t) for i in range(mask.shape[0]) for t in range(mask.shape[1]) if mask[i, t] > 0]
    k = max(1, int(len(valid) * ratio_k))
    top = {(i, t) for _, i, t in sorted(valid, reverse=True)[:k]}
    o, n, a = tolist(old), tolist(new), tolist(adv)
    loss = [[-a[i][t] * math.exp(n[i][t] - o[i][t]) + (coef * abs(n[i][t] - o[i][t]) if (i, t) in top else 0.0)
             for t in range(mask.shape[1])] for i in range(mask.shape[0])]
    assert close(pg, agg(loss, mask, "seq-mean-token-mean"))
    assert close(kl, masked_avg([[abs(n[i][t] - o[i][t]) for t in range(mask.shape[1])]
                                 for i in range(mask.shape[0])], mask))
    assert clipfrac.item() == 0 and lower.item() == 0


# ------------------------------------------------------------------------------------------------ entropy / value
@pytest.mark.parametrize("mode", MODES)
def test_entropy_loss_matches_hand_computation(mode):
    torch.manual_seed(1)
    logits = torch.randn(3, 5, 7, dtype=torch.float64) * 2
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0]], dtype=torch.float64)
    ent = []
    for i in range(3):
        row = []
        for t in range(5):
            z = logits[i, t].tolist()
            m = max(z)
            p = [math.exp(v - m) for v in z]
            s = sum(p)
            row.append(-sum(pi / s * math.log(pi / s) for pi in p))
        ent.append(row)
    assert close(ca.compute_entropy_loss(logits, mask, mode), agg(ent, mask, mode))


@pytest.mark.parametrize("mode", MODES)
def test_value_loss_matches_hand_computation(mode):
    rng = random.Random(16)
    B, L, c = 5, 6, 0.3
    vpreds = torch.tensor([[rng.gauss(0, 1) for _ in range(L)] for _ in range(B)], dtype=torch.float64)
    values = vpreds + torch.tensor([[rng.gauss(0, 0.5) for _ in range(L)] for _ in range(B)], dtype=torch.float64)
    returns = torch.tensor([[rng.gauss(0, 1) for _ in range(L)] for _ in range(B)], dtype=torch.float64)
    _, _, _, mask = make_pg(seed=16, B=B, L=L)
    vf, frac = ca.compute_value_loss(vpreds, returns, values, mask, cliprange_value=c, loss_agg_mode=mode)
    vp, v, r = tolist(vpreds), tolist(values), tolist(returns)
    loss, clipped = [[0.0] * L for _ in range(B)], [[0.0] * L for _ in range(B)]
    for i in range(B):
        for t in range(L):
            vc = min(max(vp[i][t], v[i][t] - c), v[i][t] + c)
            e1, e2 = (vp[i][t] - r[i][t]) ** 2, (vc - r[i][t]) ** 2
            loss[i][t], clipped[i][t] = max(e1, e2), float(e2 > e1)
    assert close(vf, 0.5 * agg(loss, mask, mode))
    assert close(frac, masked_avg(clipped, mask)) and 0 < frac < 1
