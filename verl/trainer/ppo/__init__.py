"""PPO-family algorithms: ``core_algos`` (estimators, losses, KL), ``metric_utils`` and the Ray driver."""
