"""verl.utils.metric: reduce_metrics' name rules and Metric's aggregation across steps and data-parallel ranks,
checked against hand computations."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from verl.trainer.ppo import metric_utils
from verl.utils.metric import AggregationType, Metric, reduce_metrics


def test_reduce_metrics_uses_the_name_and_works_in_place():
    metrics = {
        "actor/pg_loss": [1.0, 2.0, 6.0],  # mean
        "critic/score/max": [1, 5, 2],  # "max" in the name
        "response_length/min": [3, -1],  # "min" in the name
        "perf/max_memory_allocated_gb": [3.5, 7.25],  # "max" anywhere in the name, as in verl
        "actor/lr": 0.5,  # a scalar passes through
        "actor/grad_norm": torch.tensor([0.25, 0.75]),
    }
    out = reduce_metrics(metrics)
    assert out is metrics  # verl reduces the dict it is given
    assert out == {"actor/pg_loss": 3.0, "critic/score/max": 5, "response_length/min": -1,
                   "perf/max_memory_allocated_gb": 7.25, "actor/lr": 0.5, "actor/grad_norm": pytest.approx(0.5)}
    assert metric_utils.reduce_metrics is reduce_metrics  # the old import path is the same function


def test_reduce_metrics_honours_a_metric_s_own_aggregation():
    metrics = {"actor/num_tokens": Metric("sum", [3, 4, 5]), "actor/max_thing": Metric("min", [2.0, -1.0]),
               "plain": [1.0, 3.0]}
    assert reduce_metrics(metrics) == {"actor/num_tokens": 12, "actor/max_thing": -1.0, "plain": 2.0}


@pytest.mark.parametrize("aggregation,expected", [("mean", 2.5), ("sum", 10.0), ("min", 1.0), ("max", 4.0),
                                                  (AggregationType.SUM, 10.0)])
def test_metric_aggregate(aggregation, expected):
    m = Metric(aggregation, value=1.0)
    m.append(torch.tensor(2.0))
    m.extend([3, np.float32(4.0)])
    assert m.aggregate() == pytest.approx(expected)
    assert m.values == [1.0, 2.0, 3, np.float32(4.0)] and isinstance(m.values[1], float)


def test_aggregate_dp_averages_mean_and_sum_over_ranks_step_by_step():
    # 2 ranks x 3 accumulation steps
    rank0, rank1 = [1.0, 2.0, 3.0], [3.0, 6.0, 9.0]
    per_step_mean = [2.0, 4.0, 6.0]
    mean = Metric.aggregate_dp([Metric("mean", rank0), Metric("mean", rank1)])
    total = Metric.aggregate_dp([Metric("sum", rank0), Metric("sum", rank1)])
    assert mean == pytest.approx(np.mean(per_step_mean)) and total == pytest.approx(sum(per_step_mean))
    assert Metric.aggregate_dp([Metric("max", rank0), Metric("max", rank1)]) == 9.0
    assert Metric.aggregate_dp([Metric("min", rank0), Metric("min", rank1)]) == 1.0


def test_metric_errors_name_the_problem():
    with pytest.raises(ValueError, match="Unsupported aggregation type"):
        Metric("median")
    with pytest.raises(ValueError, match="Only scalar tensors"):
        Metric("mean", torch.ones(2))
    with pytest.raises(ValueError, match="Unsupported value type: str"):
        Metric("mean").append("0.5")
    with pytest.raises(ValueError, match="Aggregation type mismatch"):
        Metric("sum", 1).extend(Metric("mean", 2))
    with pytest.raises(ValueError, match="empty list"):
        Metric.aggregate_dp([])
    with pytest.raises(ValueError, match="same number of values"):
        Metric.aggregate_dp([Metric("mean", [1.0]), Metric("mean", [1.0, 2.0])])


def test_from_dict_and_init_list():
    ms = Metric.from_dict({"a": 1.0, "b": torch.tensor(2)}, aggregation="sum")
    assert {k: (m.aggregation, m.values) for k, m in ms.items()} == {"a": (AggregationType.SUM, [1.0]),
                                                                      "b": (AggregationType.SUM, [2])}
    empty = ms["a"].init_list()
    assert empty.aggregation is AggregationType.SUM and empty.values == []
