"""Each preference / distillation loss against a float64 hand computation (scalar math, one row at a time)."""

import math

import pytest
import torch

from verl.trainer.preference import (BradleyTerryLoss, PairwisePreferenceLoss, bradley_terry_loss, dpo_sigmoid_loss,
                                     generalized_jsd, hinge_loss, interleave_pairs, ipo_loss, kto_loss, pair_train_spec,
                                     pairwise_loss, reverse_kl)
from verl.protocol import DataProto


def _sig(x):
    return 1.0 / (1.0 + math.exp(-x))


@pytest.fixture
def logps():
    g = torch.Generator().manual_seed(0)
    return [(-torch.rand(16, generator=g, dtype=torch.float64) * 20) for _ in range(4)]


@pytest.mark.parametrize("eps", [0.0, 0.2])
def test_dpo_sigmoid_and_cdpo(logps, eps):
    pc, pr, rc, rr = logps
    beta = 0.3
    loss, rew_c, rew_r = dpo_sigmoid_loss(pc, pr, rc, rr, beta=beta, label_smoothing=eps)
    for i in range(16):
        h = (pc[i].item() - rc[i].item()) - (pr[i].item() - rr[i].item())
        want = -(1 - eps) * math.log(_sig(beta * h)) - eps * math.log(_sig(-beta * h))
        assert loss[i].item() == pytest.approx(want, rel=1e-12)
        assert rew_c[i].item() == pytest.approx(beta * (pc[i].item() - rc[i].item()), rel=1e-12)
        assert rew_r[i].item() == pytest.approx(beta * (pr[i].item() - rr[i].item()), rel=1e-12)


def test_ipo_and_hinge(logps):
    pc, pr, rc, rr = logps
    beta = 0.25
    ipo, _, _ = ipo_loss(pc, pr, rc, rr, beta=beta)
    hinge, _, _ = hinge_loss(pc, pr, rc, rr, beta=beta)
    for i in range(16):
        h = (pc[i].item() - rc[i].item()) - (pr[i].item() - rr[i].item())
        assert ipo[i].item() == pytest.approx((h - 1 / (2 * beta)) ** 2, rel=1e-12)
        assert hinge[i].item() == pytest.approx(max(0.0, 1 - beta * h), abs=1e-12)


def test_kto(logps):
    pol, ref = logps[0], logps[1]
    labels = torch.tensor([i % 3 != 0 for i in range(16)])
    beta, wd, wu, kl = 0.2, 1.5, 0.7, 0.9
    loss, reward = kto_loss(pol, ref, labels, torch.tensor(kl, dtype=torch.float64), beta, wd, wu)
    for i in range(16):
        r = pol[i].item() - ref[i].item()
        want = wd * (1 - _sig(beta * (r - kl))) if labels[i] else wu * (1 - _sig(beta * (kl - r)))
        assert loss[i].item() == pytest.approx(want, rel=1e-12)
        assert reward[i].item() == pytest.approx(beta * r, rel=1e-12)
    # the reference point is clamped at zero
    neg, _ = kto_loss(pol, ref, labels, torch.tensor(-3.0, dtype=torch.float64), beta, wd, wu)
    zero, _ = kto_loss(pol, ref, labels, torch.tensor(0.0, dtype=torch.float64), beta, wd, wu)
    torch.testing.assert_close(neg, zero)


def test_bradley_terry_with_and_without_margin(logps):
    c, r, m = logps[0], logps[1], logps[2].abs()
    plain = bradley_terry_loss(c, r)
    margin = bradley_terry_loss(c, r, m)
    for i in range(16):
        assert plain[i].item() == pytest.approx(math.log(1 + math.exp(-(c[i].item() - r[i].item()))), rel=1e-12)
        d = c[i].item() - r[i].item() - m[i].item()
        assert margin[i].item() == pytest.approx(math.log(1 + math.exp(-d)), rel=1e-12)


def _softmax(xs):
    top = max(xs)
    e = [math.exp(x - top) for x in xs]
    s = sum(e)
    return [v / s for v in e]


@pytest.mark.parametrize("beta", [0.1, 0.5, 0.9])
def test_generalized_jsd_and_reverse_kl(beta):
    g = torch.Generator().manual_seed(1)
    student = torch.randn(3, 5, 7, generator=g, dtype=torch.float64)
    teacher = torch.randn(3, 5, 7, generator=g, dtype=torch.float64)
    jsd = generalized_jsd(student, teacher, beta=beta)
    rkl = reverse_kl(student, teacher)
    assert jsd.shape == rkl.shape == (3, 5)
    for b in range(3):
        for t in range(5):
            q = _softmax(student[b, t].tolist())
            p = _softmax(teacher[b, t].tolist())
            m = [beta * pi + (1 - beta) * qi for pi, qi in zip(p, q)]
            want = beta * sum(pi * math.log(pi / mi) for pi, mi in zip(p, m)) + \
                (1 - beta) * sum(qi * math.log(qi / mi) for qi, mi in zip(q, m))
            assert jsd[b, t].item() == pytest.approx(want, rel=1e-10)
            assert rkl[b, t].item() == pytest.approx(sum(qi * math.log(qi / pi) for pi, qi in zip(p, q)), rel=1e-10)
    with pytest.raises(ValueError, match="0 <= beta <= 1"):
        generalized_jsd(student, teacher, beta=1.5)


def test_unknown_loss_type_names_the_choices():
    with pytest.raises(ValueError, match="hinge, ipo, sigmoid"):
        pairwise_loss("dpo")
    with pytest.raises(ValueError, match="loss_type='robust'"):
        PairwisePreferenceLoss(loss_type="robust")


def _pair_micro(n_pairs, resp_len=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    chosen = DataProto.from_dict({"response_mask": torch.ones(n_pairs, resp_len),
                                  "ref_logps": -torch.rand(n_pairs, generator=g, dtype=torch.float64) * 5,
                                  "attention_mask": torch.ones(n_pairs, 6), "margin": torch.rand(n_pairs, generator=g)})
    rejected = DataProto.from_dict({"response_mask": torch.ones(n_pairs, resp_len),
                                    "ref_logps": -torch.rand(n_pairs, generator=g, dtype=torch.float64) * 5,
                                    "attention_mask": torch.ones(n_pairs, 6), "margin": torch.zeros(n_pairs)})
    return interleave_pairs(chosen, rejected)


def test_engine_loss_reads_interleaved_rows():
    pairs = _pair_micro(3)
    micro = pairs.batch
    g = torch.Generator().manual_seed(5)
    token_lp = -torch.rand(6, 4, generator=g, dtype=torch.float64)
    loss, metrics = PairwisePreferenceLoss("sigmoid", beta=0.5)({"log_probs": token_lp}, micro)
    seq = token_lp.sum(-1)
    ref = micro["ref_logps"]
    want = []
    for i in range(3):
        h = (seq[2 * i] - ref[2 * i] - (seq[2 * i + 1] - ref[2 * i + 1])).item()
        want.append(-math.log(_sig(0.5 * h)))
    assert loss.item() == pytest.approx(sum(want) / 3, rel=1e-12)
    assert metrics["logps/chosen"].item() == pytest.approx(seq[0::2].mean().item(), rel=1e-12)
    # Bradley-Terry on the last valid token of each row (the scores of a sequence classifier)
    scores = torch.randn(6, 6, generator=g, dtype=torch.float64)
    bt_loss, bt = BradleyTerryLoss(use_margin=True)({"scores": scores}, micro)
    c, r, m = scores[0::2, -1], scores[1::2, -1], micro["margin"][0::2].double()
    assert bt_loss.item() == pytest.approx(float(torch.nn.functional.softplus(-(c - r - m)).mean()), rel=1e-12)
    assert bt["rm/accuracy"].item() == pytest.approx(float((c > r).double().mean()))


def test_pair_spec_refuses_dynamic_bsz_and_odd_splits():
    with pytest.raises(ValueError, match="use_dynamic_bsz=False"):
        pair_train_spec(8, 2, use_dynamic_bsz=True)
    with pytest.raises(ValueError, match="must be > 0 and divide"):
        pair_train_spec(8, 3)
    spec = pair_train_spec(8, 2)
    assert spec.mini_batch_size == 16 and spec.micro.micro_batch_size == 4 and spec.weight_by == "sequences"


def test_kto_loss_object_reads_the_mismatched_rows_for_its_reference_point():
    from verl.trainer.preference import KTOLoss

    beta, wd, wu = 0.5, 1.2, 0.9
    # 3 completions interleaved with their mismatched rows; per-row sequence log-probs given directly
    pol = torch.tensor([-1.0, -2.0, -3.0, -1.5, -0.5, -4.0], dtype=torch.float64)
    ref = torch.tensor([-2.0, -3.0, -2.5, -2.0, -1.0, -4.5], dtype=torch.float64)
    labels = torch.tensor([1.0, 1.0, 0.0, 0.0, 1.0, 1.0])
    loss, reward, z, logps, good = KTOLoss(beta, wd, wu).rows(pol, ref, labels)
    kl = ((-2.0 + 3.0) + (-1.5 + 2.0) + (-4.0 + 4.5)) / 3  # mismatched rows only
    assert z.item() == pytest.approx(kl, rel=1e-12)
    assert good.tolist() == [True, False, True] and logps.tolist() == [-1.0, -3.0, -0.5]
    for i, (r, g) in enumerate([(1.0, True), (-0.5, False), (0.5, True)]):
        want = wd * (1 - _sig(beta * (r - kl))) if g else wu * (1 - _sig(beta * (kl - r)))
        assert loss[i].item() == pytest.approx(want, rel=1e-12)
        assert reward[i].item() == pytest.approx(beta * r, rel=1e-12)
    # a negative KL estimate is clamped to 0
    _, _, z_neg, _, _ = KTOLoss(beta).rows(pol, ref + torch.tensor([0, 5.0] * 3, dtype=torch.float64), labels)
    assert z_neg.item() == 0.0


def test_kto_loss_object_rejects_bad_settings():
    from verl.trainer.preference import KTOLoss

    with pytest.raises(ValueError, match="desirable_weight must be > 0"):
        KTOLoss(0.1, desirable_weight=0.0)
    with pytest.raises(ValueError, match="beta must be > 0"):
        KTOLoss(-1.0)


def test_kto_metrics_and_same_prompt_accuracy():
    from verl.trainer.preference import kto_metrics, same_prompt_accuracy

    rewards = torch.tensor([0.5, -0.2, 0.1, 0.3, -1.0])
    logps = torch.tensor([-1.0, -2.0, -3.0, -4.0, -5.0])
    good = torch.tensor([True, False, True, False, False])
    m = kto_metrics(rewards, logps, good)
    assert m["rewards/chosen"].item() == pytest.approx(0.3) and m["rewards/rejected"].item() == pytest.approx(-0.3)
    assert m["rewards/margins"].item() == pytest.approx(0.6) and m["logps/chosen"].item() == pytest.approx(-2.0)
    assert m["logps/rejected"].item() == pytest.approx(-11 / 3)
    only_good = kto_metrics(rewards[:1], logps[:1], good[:1])
    assert set(only_good) == {"rewards/chosen", "logps/chosen"}
    # prompts a: (0.5 good, -0.2 bad) win; b: (0.1 good vs 0.3 bad) lose, (0.1 vs -1.0) win -> 2 of 3
    assert same_prompt_accuracy(["a", "a", "b", "b", "b"], rewards, good) == pytest.approx(2 / 3)
    assert same_prompt_accuracy(["a", "b"], rewards[:2], good[:2]) is None  # no prompt has both kinds
    assert same_prompt_accuracy(["a", "a"], torch.zeros(2), good[:2]) == 0.0  # ties do not count
