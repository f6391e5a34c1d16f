"""Offline scoring of generated responses: ``python -m verl.trainer.main_eval key=value ...`` (config/evaluation.yaml).

Reads ``data.path`` -- a parquet with a list of responses per prompt under ``data.response_key`` (what
``main_generation`` writes) -- scores every response with the data source's reward (``data.data_source_key``
picks it; ``reward_model.ground_truth`` under ``data.reward_model_key`` is the reference) or with
``custom_reward_function.{path,name}``, and prints per data source:

    test_score/<data_source>    mean over prompts of the mean score of their responses (verl's metric)
    pass@<k>/<data_source>      unbiased pass@k (Chen et al., 2021): 1 - C(n-c, k) / C(n, k) per prompt, averaged,
                                where c of the prompt's n responses score >= pass_at_k.threshold

for k = 1, 2, 4, ... up to the smallest n (and that n), or the ``pass_at_k.ks`` given. The metrics are also
printed as one JSON line (``metrics: {...}``) and, with ``output_path`` set, written there as JSON.
"""

from __future__ import annotations

import inspect
import json
import math
import os
import sys
from collections import defaultdict
from typing import Any, Callable

import hydra
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from omegaconf import DictConfig, OmegaConf

from verl.trainer.config_schema.offline import EvaluationConfig
from verl.trainer.config_schema.spec import build
from verl.trainer.main_generation import check_no_effect_keys, config_error_exit, default_config, precheck_cli
from verl.trainer.ppo.reward import CustomRewardFunction
from verl.utils.config import ConfigError
from verl.utils.reward_score import default_compute_score

_NO_EFFECT = {
    "ray_init.num_cpus": "scoring runs in this process, without Ray",
    "ray_init.timeline_json_file": "scoring runs in this process, without Ray",
}


def pass_at_k(n: int, c: int, k: int) -> float:
    """Probability that at least one of k responses drawn without replacement from n (c of them correct) is
    correct: ``1 - C(n-c, k) / C(n, k)``."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def default_ks(n_min: int) -> list[int]:
    ks, k = [], 1
    while k <= n_min:
        ks.append(k)
        k *= 2
    if ks[-1] != n_min:
        ks.append(n_min)
    return ks


def _plain(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return [_plain(v) for v in value.tolist()]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def load_rows(config: DictConfig) -> list[dict]:
    path = os.path.expanduser(str(config.data.path))
    if not os.path.isfile(path):
        raise ConfigError(f"data.path: {path} does not exist; give the parquet that main_generation wrote "
                          "(its data.output_path)")
    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as err:
        raise ConfigError(f"data.path: {path} is not a readable parquet file ({err})") from None
    for key in ("prompt_key", "response_key", "data_source_key", "reward_model_key"):
        column = config.data[key]
        if column not in table.column_names:
            raise ConfigError(f"data.path: {path} has no column {column!r} (data.{key}); its columns are "
                              f"{table.column_names}")
    if table.num_rows == 0:
        raise ConfigError(f"data.path: {path} has no rows")
    return [_plain(r) for r in table.to_pylist()]


def build_score_fn(config: DictConfig) -> Callable[..., Any]:
    """``fn(data_source, response, ground_truth, extra_info)`` from custom_reward_function, else the built-in
    scorer of each data source (``custom_reward_function.reward_kwargs`` are passed to either)."""
    section = config.get("custom_reward_function") or {}
    kwargs = OmegaConf.to_container(section.get("reward_kwargs") or OmegaConf.create({}), resolve=True)
    path = section.get("path")
    if not path:
        return lambda ds, resp, truth, extra: default_compute_score(ds, resp, truth, extra_info=extra, **kwargs)
    try:
        fn = CustomRewardFunction(str(path), str(section.get("name") or "compute_score"), kwargs)
    except (FileNotFoundError, AttributeError, ImportError, RuntimeError, TypeError) as err:
        raise ConfigError(str(err)) from None
    params = inspect.signature(fn._fn).parameters
    takes_extra = "extra_info" in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    if takes_extra:
        return lambda ds, resp, truth, extra: fn(ds, resp, truth, extra_info=extra)
    return lambda ds, resp, truth, extra: fn(ds, resp, truth)


def score_rows(rows: list[dict], config: DictConfig) -> list[tuple[str, list[float]]]:
    """``[(data_source, [score of each response])]`` per row; bad rows raise ConfigError naming the row."""
    d = config.data
    score_fn = build_score_fn(config)
    scored = []
    for i, row in enumerate(rows):
        where = f"row {i} of {config.data.path}"
        responses = row[d.response_key]
        if isinstance(responses, str):
            responses = [responses]
        if not isinstance(responses, list) or not responses or not all(isinstance(r, str) for r in responses):
            raise ConfigError(f"{where}: column {d.response_key!r} must hold a non-empty list of response strings, "
                              f"got {type(responses).__name__}")
        reward_model = row[d.reward_model_key]
        truth = reward_model.get("ground_truth") if isinstance(reward_model, dict) else None
        if truth is None:
            raise ConfigError(f"{where}: {d.reward_model_key}.ground_truth is missing; every row needs the reference "
                              "answer its responses are scored against (verl's schema: "
                              "reward_model={'style': 'rule', 'ground_truth': ...})")
        data_source = row[d.data_source_key]
        scores = []
        for response in responses:
            result = score_fn(data_source, response, truth, row.get("extra_info"))
            scores.append(float(result["score"] if isinstance(result, dict) else result))
        scored.append((str(data_source), scores))
    return scored


def compute_metrics(scored: list[tuple[str, list[float]]], ks: list[int] | None = None,
                    threshold: float = 1.0) -> dict[str, float]:
    by_source: dict[str, list[list[float]]] = defaultdict(list)
    for data_source, scores in scored:
        by_source[data_source].append(scores)
    metrics: dict[str, float] = {}
    for data_source, groups in sorted(by_source.items()):
        metrics[f"test_score/{data_source}"] = float(np.mean([np.mean(g) for g in groups]))
        n_min = min(len(g) for g in groups)
        for k in (ks or default_ks(n_min)):
            if k > n_min:
                raise ConfigError(f"pass_at_k.ks: k={k} is larger than the fewest responses of a {data_source} "
                                  f"prompt ({n_min}); use k <= {n_min}")
            values = [pass_at_k(len(g), sum(s >= threshold for s in g), k) for g in groups]
            metrics[f"pass@{k}/{data_source}"] = float(np.mean(values))
        metrics[f"num_prompts/{data_source}"] = float(len(groups))
    return metrics


def run_eval(config: DictConfig) -> dict[str, float]:
    OmegaConf.resolve(config)
    check_no_effect_keys(config, default_config("evaluation"), _NO_EFFECT, "main_eval")
    section = build(EvaluationConfig, config).pass_at_k
    ks = section.ks
    if ks is not None:
        ks = [int(k) for k in (ks if OmegaConf.is_list(ks) or isinstance(ks, list) else [ks])]
        if not ks or min(ks) < 1:
            raise ConfigError(f"pass_at_k.ks must be positive integers, got {ks}")
    threshold = float(section.threshold)
    metrics = compute_metrics(score_rows(load_rows(config), config), ks, threshold)
    for key, value in metrics.items():
        print(f"{key}: {value:.4f}" if not key.startswith("num_prompts") else f"{key}: {int(value)}")
    print("metrics: " + json.dumps(metrics), flush=True)
    out = config.get("output_path")
    if out:
        out = os.path.abspath(os.path.expanduser(str(out)))
        os.makedirs(os.path.dirname(out), exist_ok=True)
        tmp = f"{out}.tmp-{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump(metrics, f, indent=2)
        os.replace(tmp, out)
    return metrics


@hydra.main(config_path="config", config_name="evaluation", version_base=None)
def main(config: DictConfig) -> None:
    try:
        run_eval(config)
    except ConfigError as err:
        config_error_exit(err)


if __name__ == "__main__":
    precheck_cli(sys.argv[1:], "evaluation")
    main()
