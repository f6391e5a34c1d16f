"""Per-step metrics of the PPO driver, under verl's names (users' dashboards depend on them).

- :func:`compute_data_metrics`       ``critic/score|rewards|advantages|returns|values/{mean,max,min}``,
  ``critic/vf_explained_var``, ``response_length/*``, ``prompt_length/*``
- :func:`compute_timing_metrics`     ``timing_s/<section>`` and ``timing_per_token_ms/<section>``
- :func:`compute_throughout_metrics` ``perf/total_num_tokens``, ``perf/time_per_step``, ``perf/throughput``
- :func:`process_validation_metrics` per data source: ``mean@N``, ``std@N``, bootstrapped ``best@n``/``worst@n``
  and, when a ``pred`` field exists, majority-vote ``maj@n``
- :func:`reduce_metrics`             re-export of :func:`verl.utils.metric.reduce_metrics`
"""

from __future__ import annotations

from collections import defaultdict
from functools import partial
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np
import torch

from verl.utils.metric import reduce_metrics  # re-exported: verl keeps the old import path working

if TYPE_CHECKING:
    from verl.protocol import DataProto

__all__ = [
    "reduce_metrics",
    "compute_response_info",
    "compute_data_metrics",
    "compute_timing_metrics",
    "compute_throughout_metrics",
    "bootstrap_metric",
    "calc_maj_val",
    "process_validation_metrics",
]

# sections whose cost scales with all tokens (prompt + response); "gen" scales with response tokens only
_ALL_TOKEN_SECTIONS = ("ref", "values", "adv", "update_critic", "update_actor", "old_log_prob")


def compute_response_info(batch: "DataProto") -> dict[str, torch.Tensor]:
    """``response_mask`` (B, R), ``prompt_length`` and ``response_length`` (B,) as floats."""
    response_len = batch.batch["responses"].shape[-1]
    attention_mask = batch.batch["attention_mask"]
    if "response_mask" in batch.batch.keys():
        response_mask = batch.batch["response_mask"]
    else:
        response_mask = attention_mask[:, -response_len:]
    return {
        "response_mask": response_mask,
        "prompt_length": attention_mask[:, :-response_len].sum(-1).float(),
        "response_length": response_mask.sum(-1).float(),
    }


_compute_response_info = compute_response_info  # verl's private name


def _stats(prefix: str, x: torch.Tensor) -> dict[str, float]:
    if x.numel() == 0:
        return {f"{prefix}/mean": 0.0, f"{prefix}/max": 0.0, f"{prefix}/min": 0.0}
    x = x.detach().float()
    return {f"{prefix}/mean": x.mean().item(), f"{prefix}/max": x.max().item(), f"{prefix}/min": x.min().item()}


def compute_data_metrics(batch: "DataProto", use_critic: bool = True) -> dict[str, float]:
    """Batch statistics after the advantage step.

    Sequence scores/rewards are sums over the response of ``token_level_scores`` / ``token_level_rewards``;
    advantages, returns and values are taken over valid response tokens. ``critic/vf_explained_var`` is
    1 - Var(returns - values) / (Var(returns) + 1e-5). ``*_length/clip_ratio`` is the fraction of samples
    that hit the maximum length (R for responses, the padded prompt width for prompts).
    """
    info = compute_response_info(batch)
    response_mask = info["response_mask"].bool()
    max_response_length = batch.batch["responses"].shape[-1]
    max_prompt_length = batch.batch["attention_mask"].shape[-1] - max_response_length

    metrics: dict[str, float] = {}
    metrics.update(_stats("critic/score", batch.batch["token_level_scores"].sum(-1)))
    metrics.update(_stats("critic/rewards", batch.batch["token_level_rewards"].sum(-1)))
    metrics.update(_stats("critic/advantages", torch.masked_select(batch.batch["advantages"], response_mask)))
    valid_returns = torch.masked_select(batch.batch["returns"], response_mask).float()
    metrics.update(_stats("critic/returns", valid_returns))
    if use_critic:
        valid_values = torch.masked_select(batch.batch["values"], response_mask).float()
        metrics.update(_stats("critic/values", valid_values))
        explained = 1.0 - torch.var(valid_returns - valid_values) / (torch.var(valid_returns) + 1e-5)
        metrics["critic/vf_explained_var"] = explained.item()

    for name, lengths, max_len in (
        ("response_length", info["response_length"], max_response_length),
        ("prompt_length", info["prompt_length"], max_prompt_length),
    ):
        metrics.update(_stats(name, lengths))
        metrics[f"{name}/clip_ratio"] = (lengths == max_len).float().mean().item()

    if "__num_turns__" in batch.non_tensor_batch:
        turns = torch.as_tensor(np.asarray(batch.non_tensor_batch["__num_turns__"], dtype=np.float64))
        metrics.update(_stats("num_turns", turns))
    return metrics


def compute_timing_metrics(batch: "DataProto", timing_raw: dict[str, float]) -> dict[str, float]:
    """``timing_s/<name>`` for every timed section and ``timing_per_token_ms/<name>`` (ms per token) for the
    sections whose work scales with tokens: ``gen`` per response token; ``ref``, ``values``, ``adv``,
    ``update_critic``, ``update_actor``, ``old_log_prob`` per prompt + response token."""
    info = compute_response_info(batch)
    num_response_tokens = info["response_length"].sum().item()
    num_all_tokens = info["prompt_length"].sum().item() + num_response_tokens
    tokens_of = {"gen": num_response_tokens, **{name: num_all_tokens for name in _ALL_TOKEN_SECTIONS}}
    metrics = {f"timing_s/{name}": seconds for name, seconds in timing_raw.items()}
    for name, seconds in timing_raw.items():
        if name in tokens_of and tokens_of[name] > 0:
            metrics[f"timing_per_token_ms/{name}"] = seconds * 1000.0 / tokens_of[name]
    return metrics


def compute_throughout_metrics(batch: "DataProto", timing_raw: dict[str, float], n_gpus: int) -> dict[str, float]:
    """``perf/total_num_tokens`` (from ``meta_info["global_token_num"]``, else the attention mask),
    ``perf/time_per_step`` (= ``timing_raw["step"]``) and ``perf/throughput`` = tokens / (time * n_gpus)
    (tokens per second per device)."""
    if "global_token_num" in batch.meta_info:
        total_tokens = int(sum(batch.meta_info["global_token_num"]))
    else:
        total_tokens = int(batch.batch["attention_mask"].sum().item())
    step_time = timing_raw["step"]
    return {
        "perf/total_num_tokens": total_tokens,
        "perf/time_per_step": step_time,
        "perf/throughput": total_tokens / (step_time * n_gpus),
    }


def bootstrap_metric(
    data: Sequence[Any],
    subset_size: int,
    reduce_fns: Sequence[Callable[[list], float]],
    n_bootstrap: int = 1000,
    seed: int = 42,
) -> list[tuple[float, float]]:
    """Bootstrap estimate of ``reduce_fn(random subset of size subset_size, drawn with replacement)``.

    Returns ``[(mean, std)]`` over ``n_bootstrap`` resamples, one pair per reduce function (e.g. ``np.max``
    gives best-of-n). Uses its own ``RandomState(seed)``; the global numpy RNG is untouched.
    """
    rng = np.random.RandomState(seed)
    draws = rng.choice(len(data), size=(n_bootstrap, subset_size), replace=True)
    results = [[] for _ in reduce_fns]
    for idx in draws:
        subset = [data[i] for i in idx]
        for k, fn in enumerate(reduce_fns):
            results[k].append(fn(subset))
    return [(float(np.mean(r)), float(np.std(r))) for r in results]


def calc_maj_val(data: list[dict[str, Any]], vote_key: str, val_key: str) -> Any:
    """Majority vote: the ``val_key`` of the first sample whose ``vote_key`` (e.g. the predicted answer) is
    the most frequent (ties: the answer seen first)."""
    votes: dict[Any, list] = {}
    for d in data:
        votes.setdefault(d[vote_key], []).append(d[val_key])
    winner = max(votes, key=lambda v: len(votes[v]))
    return votes[winner][0]


def _sample_sizes(n_resps: int) -> list[int]:
    """2, 4, 8, ... below n_resps, then n_resps itself."""
    sizes, n = [], 2
    while n < n_resps:
        sizes.append(n)
        n *= 2
    return sizes + [n_resps]


def process_validation_metrics(
    data_sources: Sequence[str], sample_uids: Sequence[Any], infos_dict: dict[str, Sequence[Any]], seed: int = 42
) -> dict[str, dict[str, dict[str, float]]]:
    """Validation metrics ``{data_source: {var_name: {metric_name: value}}}``.

    Samples are grouped by (data source, ``sample_uids[i]``): the prompt's uid, as verl passes, or the prompt
    text, which groups the same way. For each numeric variable in ``infos_dict`` (e.g.
    ``reward``, ``acc``) and each prompt with N responses: ``mean@N``; if N > 1 also ``std@N`` and, for
    n in 2, 4, ..., N, bootstrapped ``best@n/{mean,std}``, ``worst@n/{mean,std}`` and, when ``infos_dict``
    has a ``pred`` entry, ``maj@n/{mean,std}`` (the variable's value of the majority-voted prediction).
    Each metric is then averaged over the prompts of its data source. String variables are skipped.
    """
    grouped: dict = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for i, (source, prompt) in enumerate(zip(data_sources, sample_uids)):
        for var_name, values in infos_dict.items():
            grouped[source][prompt][var_name].append(values[i])

    per_prompt: dict = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for source, prompts in grouped.items():
        for var2vals in prompts.values():
            preds = var2vals.get("pred")
            for var_name, vals in var2vals.items():
                if isinstance(vals[0], str):
                    continue
                n_resps = len(vals)
                metric = {f"mean@{n_resps}": float(np.mean(vals))}
                if n_resps > 1:
                    metric[f"std@{n_resps}"] = float(np.std(vals))
                    for n in _sample_sizes(n_resps):
                        (bo_mean, bo_std), (wo_mean, wo_std) = bootstrap_metric(vals, n, [np.max, np.min], seed=seed)
                        metric[f"best@{n}/mean"], metric[f"best@{n}/std"] = bo_mean, bo_std
                        metric[f"worst@{n}/mean"], metric[f"worst@{n}/std"] = wo_mean, wo_std
                        if preds is not None:
                            votes = [{"val": v, "pred": p} for v, p in zip(vals, preds)]
                            vote_fn = partial(calc_maj_val, vote_key="pred", val_key="val")
                            [(maj_mean, maj_std)] = bootstrap_metric(votes, n, [vote_fn], seed=seed)
                            metric[f"maj@{n}/mean"], metric[f"maj@{n}/std"] = maj_mean, maj_std
                for metric_name, value in metric.items():
                    per_prompt[source][var_name][metric_name].append(value)

    return {
        source: {
            var_name: {metric_name: float(np.mean(vals)) for metric_name, vals in metrics.items()}
            for var_name, metrics in var2metrics.items()
        }
        for source, var2metrics in per_prompt.items()
    }
