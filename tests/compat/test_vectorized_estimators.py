"""grpo_vectorized / rloo_vectorized equal a plain per-sample loop (float64 reference), through the registry and
through compute_advantage; verl.utils.groupwise on its own."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from verl.protocol import DataProto
from verl.trainer.ppo import core_algos
from verl.utils import as_torch_index, group_mean_std


def grpo_loop(scores: list[float], uids: list, eps: float, norm: bool) -> list[float]:
    """GRPO as the paper writes it, one sample at a time (singleton group: mean 0, std 1)."""
    out = []
    for s, u in zip(scores, uids):
        group = [x for x, v in zip(scores, uids) if v == u]
        if len(group) == 1:
            mean, std = 0.0, 1.0
        else:
            mean = sum(group) / len(group)
            std = math.sqrt(sum((x - mean) ** 2 for x in group) / (len(group) - 1))
            std = max(std, math.sqrt(eps))  # verl's vectorised variant floors the variance at eps
        out.append((s - mean) / (std + eps) if norm else s - mean)
    return out


def rloo_loop(scores: list[float], uids: list) -> list[float]:
    out = []
    for i, (s, u) in enumerate(zip(scores, uids)):
        others = [x for j, (x, v) in enumerate(zip(scores, uids)) if v == u and j != i]
        out.append(s - sum(others) / len(others) if others else 0.0)
    return out


def batch(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    uids = np.array(["p3", "p1", "p3", "p2", "p1", "p3", "p4", "p2", "p2", "p5", "p5"], dtype=object)
    rewards = torch.zeros(len(uids), 6, dtype=torch.float64)
    lengths = torch.randint(1, 7, (len(uids),), generator=g)
    mask = (torch.arange(6)[None, :] < lengths[:, None]).to(torch.float64)
    last = lengths - 1
    rewards[torch.arange(len(uids)), last] = torch.randn(len(uids), generator=g, dtype=torch.float64)
    rewards[9, last[9]] = rewards[10, last[10]] = 0.75  # a group whose scores are all equal
    return rewards, mask, uids


@pytest.mark.parametrize("norm", [True, False], ids=["grpo", "dr_grpo"])
def test_grpo_vectorized_equals_the_loop_and_the_grpo_estimator(norm):
    rewards, mask, uids = batch()
    adv, ret = core_algos.compute_grpo_vectorized_outcome_advantage(rewards, mask, uids,
                                                                   norm_adv_by_std_in_grpo=norm)
    expected = torch.tensor(grpo_loop(rewards.sum(-1).tolist(), list(uids), 1e-6, norm), dtype=torch.float64)
    assert adv.dtype == torch.float64 and torch.equal(adv, ret)
    torch.testing.assert_close(adv, expected[:, None] * mask, rtol=1e-12, atol=1e-12)
    singleton = rewards[6].sum() / (1 + 1e-6) if norm else rewards[6].sum()  # group of one: mean 0, std 1
    assert torch.all(adv[9] == 0) and torch.allclose(adv[6], singleton * mask[6], rtol=1e-12, atol=0)
    loop_version, _ = core_algos.compute_grpo_outcome_advantage(rewards, mask, uids, norm_adv_by_std_in_grpo=norm)
    torch.testing.assert_close(adv, loop_version, rtol=1e-9, atol=1e-9)


def test_rloo_vectorized_equals_the_loop():
    rewards, mask, uids = batch(1)
    adv, _ = core_algos.compute_rloo_vectorized_outcome_advantage(rewards, mask, uids)
    expected = torch.tensor(rloo_loop(rewards.sum(-1).tolist(), list(uids)), dtype=torch.float64)
    torch.testing.assert_close(adv, expected[:, None] * mask, rtol=1e-12, atol=1e-12)


def test_vectorized_estimators_through_compute_advantage_on_float32():
    rewards, mask, uids = batch(2)
    data = DataProto.from_dict({"token_level_rewards": rewards.float(), "response_mask": mask.float()},
                               {"uid": uids})
    for name in ("grpo_vectorized", core_algos.AdvantageEstimator.GRPO_VECTORIZED):
        out = core_algos.compute_advantage(data, adv_estimator=name, norm_adv_by_std_in_grpo=True)
        expected = torch.tensor(grpo_loop(rewards.sum(-1).tolist(), list(uids), 1e-6, True))
        torch.testing.assert_close(out.batch["advantages"], expected[:, None] * mask.float(), rtol=1e-5, atol=1e-5)
    assert core_algos.get_adv_estimator_fn("rloo_vectorized") is core_algos.compute_rloo_vectorized_outcome_advantage


def test_group_helpers():
    ids = as_torch_index(np.array(["b", "a", "b", "c"], dtype=object))
    assert ids.tolist() == [1, 0, 1, 2] and ids.dtype == torch.long
    assert as_torch_index([4, 1, 4]).tolist() == [4, 1, 4]  # integer labels are ids already, as in verl
    assert as_torch_index(torch.tensor([2.0, 0.0])).tolist() == [2, 0]
    mean, std, count = group_mean_std(torch.tensor([1.0, 3.0, 5.0, 7.0], dtype=torch.float64),
                                      torch.tensor([0, 0, 1, 2]))
    assert count.tolist() == [2, 1, 1]
    assert mean.tolist() == [2.0, 0.0, 0.0] and std[0].item() == pytest.approx(math.sqrt(2.0)) and std[1] == 1
