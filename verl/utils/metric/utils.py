"""Metric aggregation with verl's semantics (see :mod:`verl.utils.metric`)."""

from __future__ import annotations

from enum import Enum
from typing import Any, Union

import numpy as np
import torch

__all__ = ["AggregationType", "Metric", "reduce_metrics"]

Numeric = Union[int, float, np.number, np.ndarray, torch.Tensor]
_NUMERIC_TYPES = (int, float, np.number, np.ndarray)


class AggregationType(Enum):
    """How the values collected for one metric become one number."""

    MEAN = "mean"
    SUM = "sum"
    MIN = "min"
    MAX = "max"


def _as_aggregation(aggregation: str | AggregationType) -> AggregationType:
    if isinstance(aggregation, AggregationType):
        return aggregation
    try:
        return AggregationType(aggregation)
    except ValueError:
        choices = [a.value for a in AggregationType]
        raise ValueError(f"Unsupported aggregation type: {aggregation!r}; use one of {choices}") from None


def _scalar(value: Any) -> int | float | np.number | np.ndarray:
    """A plain number for ``value``; a one-element tensor is read out (``.item()``), anything else is refused."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(f"Only scalar tensors can be converted to float; got shape {tuple(value.shape)}")
        return value.detach().item()
    if isinstance(value, bool) or not isinstance(value, _NUMERIC_TYPES):
        raise ValueError(f"Unsupported value type: {type(value).__name__}; a metric value is an int, float, numpy "
                         f"number or one-element tensor")
    return value


def _aggregate(values, aggregation: AggregationType) -> float:
    if aggregation is AggregationType.MEAN:
        return np.mean(values)
    if aggregation is AggregationType.SUM:
        return np.sum(values)
    if aggregation is AggregationType.MIN:
        return np.min(values)
    return np.max(values)


class Metric:
    """Values of one metric plus the rule that combines them.

    ``Metric("sum", 3)`` then ``.append(4)`` and ``.aggregate()`` gives 7. ``Metric.aggregate_dp`` combines the
    same metric from several data-parallel ranks, each holding one value per gradient-accumulation step:
    mean/sum metrics are first averaged over ranks step by step (every rank saw an equal share of the batch),
    min/max take the extreme over all values.
    """

    def __init__(self, aggregation: str | AggregationType, value: Numeric | list | None = None) -> None:
        self.aggregation = _as_aggregation(aggregation)
        self.values: list = []
        if value is not None:
            if isinstance(value, (list, tuple)):
                self.extend(list(value))
            else:
                self.append(value)

    def append(self, value: Union[Numeric, "Metric"]) -> None:
        """Add one value (or every value of another Metric with the same aggregation)."""
        if isinstance(value, Metric):
            self.extend(value)
            return
        self.values.append(_scalar(value))

    def extend(self, values: Union["Metric", list]) -> None:
        """Add several values; a Metric must use the same aggregation (ValueError otherwise)."""
        if isinstance(values, Metric):
            if values.aggregation != self.aggregation:
                raise ValueError(f"Aggregation type mismatch: {self.aggregation} != {values.aggregation}")
            values = values.values
        for value in values:
            self.append(value)

    def aggregate(self) -> float:
        """The one number: mean / sum / min / max of the values collected so far."""
        return _aggregate(self.values, self.aggregation)

    @classmethod
    def aggregate_dp(cls, metric_lists: list["Metric"]) -> float:
        """Combine one Metric per data-parallel rank (each with the same number of values)."""
        if not metric_lists:
            raise ValueError("Cannot aggregate an empty list of metrics.")
        lengths = [len(m.values) for m in metric_lists]
        if len(set(lengths)) != 1:
            raise ValueError(f"All Metric instances must have the same number of values for dp aggregation: {lengths}")
        aggregation = metric_lists[0].aggregation
        table = np.array([m.values for m in metric_lists])  # [dp ranks, accumulation steps]
        if aggregation in (AggregationType.MEAN, AggregationType.SUM):
            return _aggregate(np.mean(table, axis=0), aggregation)
        return _aggregate(table.reshape(-1), aggregation)

    @classmethod
    def from_dict(cls, data: dict[str, Numeric], aggregation: str | AggregationType) -> dict[str, "Metric"]:
        """``{name: value}`` -> ``{name: Metric(aggregation, value)}``."""
        return {key: cls(aggregation=aggregation, value=value) for key, value in data.items()}

    def init_list(self) -> "Metric":
        """An empty Metric with the same aggregation."""
        return Metric(aggregation=self.aggregation)

    def __repr__(self) -> str:
        return f"Metric({self.aggregation.value!r}, {self.values!r})"


def reduce_metrics(metrics: dict[str, Any]) -> dict[str, Any]:
    """Replace each list of values in ``metrics`` by one number, in place, and return the same dict.

    A ``Metric`` uses its own aggregation. Otherwise the name decides, as in verl: a name containing "max"
    takes ``np.max``, one containing "min" takes ``np.min``, everything else ``np.mean`` (so a scalar passes
    through unchanged). Tensors are read as numpy arrays first.
    """
    for key, val in metrics.items():
        if isinstance(val, torch.Tensor):
            val = val.detach().cpu().numpy()
        if isinstance(val, Metric):
            metrics[key] = val.aggregate()
        elif "max" in key:
            metrics[key] = np.max(val)
        elif "min" in key:
            metrics[key] = np.min(val)
        else:
            metrics[key] = np.mean(val)
    return metrics
