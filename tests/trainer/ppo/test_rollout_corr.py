"""algorithm.rollout_correction: truncated IS weights against hand computations; bypass-mode metrics."""

import math

import pytest
import torch

from verl.trainer.ppo.core_algos import agg_loss
from verl.trainer.ppo.policy_loss import get_policy_loss_fn
from verl.trainer.ppo.rollout_corr import compute_rollout_is_weights, on_policy_metrics, reinforce_is_loss
from verl.workers.config import FSDPActorConfig


def _batch():
    old = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -0.1, -4.0]])
    rollout = torch.tensor([[-1.5, -1.0, -0.5], [-0.3, -0.6, -9.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    return old, rollout, mask


def test_token_level_weights_by_hand():
    old, rollout, mask = _batch()
    w, m = compute_rollout_is_weights(old, rollout, mask, "token", threshold=1.5)
    # exp(old - rollout): row 0: e^0.5=1.6487 -> 1.5 (truncated), e^-1=0.3679, 1; row 1: 1, e^0.5 -> 1.5, padding 0
    expected = torch.tensor([[1.5, math.exp(-1.0), 1.0], [1.0, 1.5, 0.0]])
    assert torch.allclose(w, expected, atol=1e-6)
    raw = [math.exp(0.5), math.exp(-1.0), 1.0, 1.0, math.exp(0.5)]
    assert m["rollout_corr/rollout_is_mean"] == pytest.approx(sum(raw) / 5, rel=1e-6)
    assert m["rollout_corr/rollout_is_max"] == pytest.approx(math.exp(0.5), rel=1e-6)
    assert m["rollout_corr/rollout_is_min"] == pytest.approx(math.exp(-1.0), rel=1e-6)
    assert m["rollout_corr/rollout_is_truncated_frac"] == pytest.approx(2 / 5)


def test_sequence_level_weights_by_hand():
    old, rollout, mask = _batch()
    w, m = compute_rollout_is_weights(old, rollout, mask, "sequence", threshold=2.0)
    # row 0: sum log-ratio = 0.5 - 1 + 0 = -0.5 -> e^-0.5 on every token; row 1: 0 + 0.5 (padding ignored) -> e^0.5
    assert torch.allclose(w[0], torch.full((3,), math.exp(-0.5)), atol=1e-6)
    assert torch.allclose(w[1], torch.tensor([math.exp(0.5), math.exp(0.5), 0.0]), atol=1e-6)
    assert m["rollout_corr/rollout_is_truncated_frac"] == 0.0
    w_cut, _ = compute_rollout_is_weights(old, rollout, mask, "sequence", threshold=1.2)
    assert torch.allclose(w_cut[1, :2], torch.full((2,), 1.2))


def test_huge_log_ratio_is_bounded_not_inf():
    old = torch.tensor([[0.0, 0.0]])
    rollout = torch.tensor([[-60.0, -60.0]])
    w, m = compute_rollout_is_weights(old, rollout, torch.ones(1, 2), "sequence", threshold=1e30)
    assert torch.isfinite(w).all() and m["rollout_corr/rollout_is_max"] == pytest.approx(math.exp(20.0), rel=1e-9)


def test_bad_level_and_threshold():
    old, rollout, mask = _batch()
    with pytest.raises(ValueError, match="token' or 'sequence'"):
        compute_rollout_is_weights(old, rollout, mask, "geometric", 2.0)
    with pytest.raises(ValueError, match="> 0"):
        compute_rollout_is_weights(old, rollout, mask, "token", 0.0)


def test_on_policy_metrics_use_flagged_rows_only():
    old, rollout, mask = _batch()
    on_policy = {"on_policy_log_probs": rollout.clone(), "on_policy_entropys": torch.tensor([[1.0, 2.0, 3.0],
                                                                                             [9.0, 9.0, 9.0]]),
                 "on_policy_rows": torch.tensor([True, False])}
    on_policy["on_policy_log_probs"][0, 1] = -1.1  # row 0 token 1 differs from the rollout's -1.0
    m = on_policy_metrics(on_policy, rollout, mask, "token-mean")
    assert m["actor/entropy"] == pytest.approx(2.0)  # row 1 (entropy 9) is not flagged
    assert m["training/rollout_probs_diff_rows"] == 1.0
    assert m["training/rollout_probs_diff_max"] == pytest.approx(math.exp(-1.0) - math.exp(-1.1), rel=1e-5)
    assert on_policy_metrics({**on_policy, "on_policy_rows": torch.tensor([False, False])}, rollout, mask,
                             "token-mean") == {}


def test_batch_normalized_weights_average_one_by_hand():
    old, rollout, mask = _batch()
    w, _ = compute_rollout_is_weights(old, rollout, mask, "token", threshold=1.5, batch_normalize=True)
    truncated = [1.5, math.exp(-1.0), 1.0, 1.0, 1.5]  # the valid tokens of test_token_level_weights_by_hand
    mean = sum(truncated) / 5
    expected = torch.tensor([[1.5 / mean, math.exp(-1.0) / mean, 1.0 / mean], [1.0 / mean, 1.5 / mean, 0.0]])
    assert torch.allclose(w, expected, atol=1e-6)
    # sequence level: each response's weight counts once (row 0 has 3 valid tokens, row 1 two)
    w, _ = compute_rollout_is_weights(old, rollout, mask, "sequence", threshold=2.0, batch_normalize=True)
    mean = (math.exp(-0.5) + math.exp(0.5)) / 2
    assert torch.allclose(w[0], torch.full((3,), math.exp(-0.5) / mean), atol=1e-6)
    assert torch.allclose(w[1], torch.tensor([math.exp(0.5) / mean, math.exp(0.5) / mean, 0.0]), atol=1e-6)


def test_reinforce_loss_and_gradient_by_hand():
    """-w * A * log pi, w = min(pi/pi_rollout, cap) detached: loss value and gradient in float64 by hand."""
    log_prob = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -0.1, -4.0]], dtype=torch.float64, requires_grad=True)
    rollout = torch.tensor([[-1.5, -1.0, -0.5], [-0.3, -0.6, -9.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    adv = torch.tensor([[1.0, 1.0, 1.0], [-2.0, -2.0, -2.0]], dtype=torch.float64)
    loss, truncated, ppo_kl, lower = reinforce_is_loss(log_prob, rollout, adv, mask, "token-mean", "token", 1.5)
    w = [[1.5, math.exp(-1.0), 1.0], [1.0, 1.5, 0.0]]
    lp = [[-1.0, -2.0, -0.5], [-0.3, -0.1, -4.0]]
    a = [1.0, -2.0]
    terms = [-w[i][j] * a[i] * lp[i][j] for i in range(2) for j in range(3) if mask[i][j]]
    assert loss.item() == pytest.approx(sum(terms) / 5, rel=1e-8)  # agg_loss divides by (valid tokens + 1e-8)
    assert truncated.item() == pytest.approx(2 / 5) and lower.item() == 0.0
    assert ppo_kl.item() == pytest.approx((-0.5 + 1.0 + 0.0 + 0.0 - 0.5) / 5, abs=1e-12)  # mean(rollout - log pi)
    loss.backward()
    expected = torch.tensor([[-w[i][j] * a[i] / 5 * int(mask[i][j]) for j in range(3)] for i in range(2)],
                            dtype=torch.float64)
    assert torch.allclose(log_prob.grad, expected, atol=1e-9)  # the weights carry no gradient


def test_reinforce_without_is_level_is_plain_reinforce_and_matches_ppo_gradient_on_policy():
    """rollout_is=null: w = 1. On policy (pi_theta = pi_rollout) its gradient equals the PPO loss's, whose ratio
    is 1 there (d ratio / d log pi = 1)."""
    torch.manual_seed(0)
    lp = torch.randn(3, 4, dtype=torch.float64) - 1
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]])
    adv = torch.randn(3, 1, dtype=torch.float64).expand(3, 4)
    a = lp.clone().requires_grad_(True)
    loss, *_ = reinforce_is_loss(a, lp, adv, mask, "token-mean", None, 2.0)
    assert loss.item() == pytest.approx(agg_loss(-adv * lp, mask, "token-mean").item(), rel=1e-12)
    loss.backward()
    b = lp.clone().requires_grad_(True)
    ppo_loss, *_ = get_policy_loss_fn("vanilla")(old_log_prob=lp, log_prob=b, advantages=adv, response_mask=mask,
                                                 loss_agg_mode="token-mean", config=FSDPActorConfig())
    ppo_loss.backward()
    assert torch.allclose(a.grad, b.grad, atol=1e-12)
