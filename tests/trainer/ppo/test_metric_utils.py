"""metric_utils vs hand computations."""

import math
import statistics

import numpy as np
import pytest
import torch

from verl.trainer.ppo import metric_utils as mu


def build_batch():
    from verl.protocol import DataProto

    # 3 samples, prompt width 4 (left padded), response width 5 (right padded)
    prompt_mask = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1], [0, 0, 1, 1]])
    resp_mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]])
    scores = torch.zeros(3, 5)
    scores[0, 2], scores[1, 4], scores[2, 0] = 1.0, 0.0, 0.5
    rewards = scores - 0.1 * resp_mask
    adv = torch.arange(15, dtype=torch.float32).reshape(3, 5) - 7
    returns = adv * 0.5 + 1
    values = returns + torch.tensor([[0.1, -0.2, 0.3, 9, 9], [0.0, 0.1, -0.1, 0.2, -0.3], [0.4, 9, 9, 9, 9]])
    tensors = {
        "responses": torch.zeros(3, 5, dtype=torch.long),
        "attention_mask": torch.cat([prompt_mask, resp_mask], -1),
        "response_mask": resp_mask,
        "token_level_scores": scores,
        "token_level_rewards": rewards,
        "advantages": adv,
        "returns": returns,
        "values": values,
    }
    return DataProto.from_dict(tensors=tensors, meta_info={"global_token_num": [6, 9, 3]}), resp_mask


def valid(t, mask):
    return [t[i, j].item() for i in range(t.shape[0]) for j in range(t.shape[1]) if mask[i, j]]


def test_compute_data_metrics_hand_computation():
    batch, mask = build_batch()
    m = mu.compute_data_metrics(batch, use_critic=True)
    assert m["critic/score/mean"] == pytest.approx(0.5) and m["critic/score/max"] == 1.0 and m["critic/score/min"] == 0.0
    rewards = [1.0 - 0.3, 0.0 - 0.5, 0.5 - 0.1]
    assert m["critic/rewards/mean"] == pytest.approx(sum(rewards) / 3)
    assert m["critic/rewards/min"] == pytest.approx(-0.5)
    adv = valid(batch.batch["advantages"], mask)
    assert m["critic/advantages/mean"] == pytest.approx(sum(adv) / len(adv))
    assert (m["critic/advantages/max"], m["critic/advantages/min"]) == (max(adv), min(adv))
    ret, val = valid(batch.batch["returns"], mask), valid(batch.batch["values"], mask)
    assert m["critic/returns/mean"] == pytest.approx(statistics.mean(ret))
    assert m["critic/values/max"] == pytest.approx(max(val))  # the 9s on padding are ignored
    diff = [r - v for r, v in zip(ret, val)]
    assert m["critic/vf_explained_var"] == pytest.approx(1 - statistics.variance(diff) / (statistics.variance(ret) + 1e-5),
                                                         rel=1e-5)
    assert (m["response_length/mean"], m["response_length/max"], m["response_length/min"]) == (3.0, 5.0, 1.0)
    assert m["response_length/clip_ratio"] == pytest.approx(1 / 3)
    assert (m["prompt_length/mean"], m["prompt_length/max"], m["prompt_length/min"]) == (3.0, 4.0, 2.0)
    assert m["prompt_length/clip_ratio"] == pytest.approx(1 / 3)
    no_critic = mu.compute_data_metrics(batch, use_critic=False)
    assert "critic/values/mean" not in no_critic and "critic/vf_explained_var" not in no_critic


def test_timing_and_throughput_metrics():
    batch, _ = build_batch()
    timing = {"gen": 0.9, "ref": 0.18, "update_actor": 3.6, "step": 6.0, "reward": 0.1}
    m = mu.compute_timing_metrics(batch, timing)
    assert all(m[f"timing_s/{k}"] == v for k, v in timing.items())
    # response tokens 3+5+1 = 9; prompt tokens 3+4+2 = 9
    assert m["timing_per_token_ms/gen"] == pytest.approx(900 / 9)
    assert m["timing_per_token_ms/ref"] == pytest.approx(180 / 18)
    assert m["timing_per_token_ms/update_actor"] == pytest.approx(3600 / 18)
    assert "timing_per_token_ms/step" not in m and "timing_per_token_ms/reward" not in m
    p = mu.compute_throughout_metrics(batch, timing, n_gpus=2)
    assert p == {"perf/total_num_tokens": 18, "perf/time_per_step": 6.0, "perf/throughput": 18 / (6.0 * 2)}


def test_reduce_metrics():
    out = mu.reduce_metrics({"actor/pg_loss": [1.0, 2.0, 6.0], "critic/score/max": [1, 5, 2], "x/min": [3, -1],
                             "training/rollout_probs_diff_max": [0.1, 0.3], "actor/lr": 0.5})
    assert out == {"actor/pg_loss": 3.0, "critic/score/max": 5, "x/min": -1,
                   "training/rollout_probs_diff_max": 0.3, "actor/lr": 0.5}


def exact_best_of_n(values, n):
    """E[max of n draws with replacement] for distinct values: sum_k x_(k) ((k/N)^n - ((k-1)/N)^n)."""
    xs, N = sorted(values), len(values)
    return sum(x * ((k / N) ** n - ((k - 1) / N) ** n) for k, x in enumerate(xs, start=1))


def test_bootstrap_best_and_worst_of_n_match_exact_expectation():
    values = [0.1, 0.7, 0.3, 0.9, 0.4, 0.2]
    for n in (2, 4, 6):
        (best, best_std), (worst, _) = mu.bootstrap_metric(values, n, [np.max, np.min], n_bootstrap=4000, seed=0)
        exact_best = exact_best_of_n(values, n)
        exact_worst = -exact_best_of_n([-v for v in values], n)
        assert abs(best - exact_best) < 4 * best_std / math.sqrt(4000) + 1e-9
        assert abs(worst - exact_worst) < 0.02
    # deterministic for a seed, and leaves the global RNG alone
    np.random.seed(123)
    before = np.random.get_state()[1].copy()
    a = mu.bootstrap_metric(values, 3, [np.mean], seed=5)
    assert a == mu.bootstrap_metric(values, 3, [np.mean], seed=5)
    assert np.array_equal(before, np.random.get_state()[1])


def test_calc_maj_val():
    data = [{"pred": "4", "val": 1.0}, {"pred": "5", "val": 0.0}, {"pred": "5", "val": 0.2}, {"pred": "4", "val": 0.9},
            {"pred": "5", "val": 0.3}]
    assert mu.calc_maj_val(data, vote_key="pred", val_key="val") == 0.0  # "5" wins, first val of "5"
    assert mu.calc_maj_val(data[:4], vote_key="pred", val_key="val") == 1.0  # tie -> first seen


def test_process_validation_metrics_structure_and_values():
    # source A: prompt p1 with 5 responses, p2 with 5; source B: q1 with a single response
    sources = ["A"] * 10 + ["B"]
    prompts = ["p1"] * 5 + ["p2"] * 5 + ["q1"]
    reward = [1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.5, 0.0, 1.0, 0.25]
    pred = ["4", "3", "4", "4", "3", "7", "7", "8", "7", "9", "1"]
    out = mu.process_validation_metrics(sources, prompts, {"reward": reward, "pred": pred}, seed=1)
    assert set(out) == {"A", "B"} and set(out["A"]) == {"reward"}  # pred is a string: skipped
    a = out["A"]["reward"]
    assert a["mean@5"] == pytest.approx((np.mean(reward[:5]) + np.mean(reward[5:10])) / 2)
    assert a["std@5"] == pytest.approx((np.std(reward[:5]) + np.std(reward[5:10])) / 2)
    expected_keys = {"mean@5", "std@5"}
    for n in (2, 4, 5):
        expected_keys |= {f"{k}@{n}/{s}" for k in ("best", "worst", "maj") for s in ("mean", "std")}
    assert set(a) == expected_keys
    # p1's majority answer "4" has reward 1, p2's "7" has reward 0: maj@5 mean is close to 0.5 and
    # best@n rises with n while worst@n falls
    assert a["best@2/mean"] <= a["best@4/mean"] <= a["best@5/mean"] <= 1.0
    assert a["worst@5/mean"] <= a["worst@2/mean"]
    assert a["maj@5/mean"] == pytest.approx(0.5, abs=0.1)
    exact_best2 = (exact_best_of_n([1.0, 0.0, 1.0, 1.0, 0.0], 2) + exact_best_of_n([0.0, 0.0, 0.5, 0.0, 1.0], 2)) / 2
    assert a["best@2/mean"] == pytest.approx(exact_best2, abs=0.05)
    assert out["B"]["reward"] == {"mean@1": 0.25}
