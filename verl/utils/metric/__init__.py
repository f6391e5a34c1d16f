"""Reducing per-micro-batch / per-rank metric values to one number per name (``verl.utils.metric``).

``reduce_metrics`` is what the trainer calls on the ``meta_info["metrics"]`` lists its workers return;
``Metric`` carries its own aggregation (mean, sum, min, max) so a value that is not a mean (a token count, a
maximum) survives the trip through several data-parallel ranks and gradient-accumulation steps.
"""

from verl.utils.metric.utils import AggregationType, Metric, reduce_metrics

__all__ = ["AggregationType", "Metric", "reduce_metrics"]
