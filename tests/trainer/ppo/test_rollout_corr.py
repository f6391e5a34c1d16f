"""algorithm.rollout_correction: truncated IS weights against hand computations; bypass-mode metrics."""

import math

import pytest
import torch

from verl.trainer.ppo.rollout_corr import compute_rollout_is_weights, on_policy_metrics


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
