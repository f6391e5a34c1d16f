"""Rule-based answer scorers and the default dispatch by ``data_source``.

``default_compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs)`` is what the
reward managers call when no ``custom_reward_function.path`` is configured. It returns a float, or a dict
with a ``"score"`` float plus extra keys (which the reward managers report as ``reward_extra_info``).

Adding a data source is one decorated function::

    from verl.utils.reward_score import register_score_fn

    @register_score_fn("my_org/my_dataset")
    def _score_my_dataset(solution_str, ground_truth, extra_info=None, **kwargs):
        return 1.0 if solution_str.strip().endswith(ground_truth) else 0.0
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable

# the scorers use only the standard library (math-verify, which is heavy, is imported by its wrapper on first use)
from verl.utils.reward_score import (arithmetic, countdown, geo3k, gsm8k, gsm_symbolic, math_dapo, math_verify,
                                     sandbox_fusion)
from verl.utils.reward_score import math as math_score

__all__ = ["default_compute_score", "register_score_fn", "get_score_fn", "require_score_fn",
           "supported_data_sources", "UnknownDataSourceError", "is_default_scorer"]

ScoreFn = Callable[..., Any]
_SCORE_FNS: dict[str, ScoreFn] = {}
_PREFIX_SCORE_FNS: dict[str, ScoreFn] = {}

MATH_DATA_SOURCES = (
    "lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500",
    "numina_aops_forum", "numina_synthetic_math", "numina_amc_aime", "numina_synthetic_amc",
    "numina_cn_k12", "numina_olympiads",
)


class UnknownDataSourceError(NotImplementedError):
    """No built-in scorer for a data_source (verl raises NotImplementedError here; this is a subclass)."""


def register_score_fn(*data_sources: str, prefix: bool = False) -> Callable[[ScoreFn], ScoreFn]:
    """Register ``fn(solution_str, ground_truth, extra_info=None, **kwargs)`` for the given data sources
    (with ``prefix=True``: for every data source starting with one of them)."""
    if not data_sources:
        raise ValueError("register_score_fn needs at least one data_source name")
    table = _PREFIX_SCORE_FNS if prefix else _SCORE_FNS

    def decorator(fn: ScoreFn) -> ScoreFn:
        for name in data_sources:
            table[name] = fn
        return fn

    return decorator


def get_score_fn(data_source: str) -> ScoreFn | None:
    data_source = str(data_source)
    if data_source in _SCORE_FNS:
        return _SCORE_FNS[data_source]
    for prefix in sorted(_PREFIX_SCORE_FNS, key=len, reverse=True):  # longest prefix wins
        if data_source.startswith(prefix):
            return _PREFIX_SCORE_FNS[prefix]
    return None


def require_score_fn(data_source: str) -> ScoreFn:
    """The built-in scorer for ``data_source``; raises ``UnknownDataSourceError`` (saying what would work)
    if there is none."""
    fn = get_score_fn(data_source)
    if fn is None:
        raise UnknownDataSourceError(
            f"No built-in reward function for data_source={str(data_source)!r}. "
            f"Supported data sources: {', '.join(supported_data_sources())}. "
            "To score other data, write a Python file with "
            "`def compute_score(data_source, solution_str, ground_truth, extra_info=None): ...` and pass "
            "`custom_reward_function.path=/path/to/file.py` (and `custom_reward_function.name=<function>` if it "
            "is not called compute_score). See docs/custom_reward.md."
        )
    return fn


def supported_data_sources() -> list[str]:
    return sorted(_SCORE_FNS) + sorted(f"{p}*" for p in _PREFIX_SCORE_FNS)


# ---------------------------------------------------------------------------------------------- built-ins

@register_score_fn("openai/gsm8k")
def _score_gsm8k(solution_str, ground_truth, extra_info=None, method="strict", format_score=0.0, score=1.0):
    return gsm8k.compute_score(solution_str, ground_truth, method=method, format_score=format_score, score=score)


@register_score_fn(*MATH_DATA_SOURCES)
def _score_math(solution_str, ground_truth, extra_info=None, use_math_verify=True):
    """String-normalised MATH equivalence first (fast, exact); if that fails, symbolic equivalence of
    the boxed answer with math-verify (catches ``2/4`` vs ``0.5``, reordered sets, ...)."""
    if math_score.compute_score(solution_str, ground_truth) == 1.0:
        return 1.0
    answer = math_score.extract_answer(solution_str)
    if answer is None or not use_math_verify:
        return 0.0
    return math_verify.compute_score("\\boxed{" + answer + "}", str(ground_truth))


@register_score_fn("hiyouga/geometry3k")
def _score_geo3k(solution_str, ground_truth, extra_info=None, use_boxed=True, format_score=0.1):
    return geo3k.compute_score(solution_str, ground_truth, use_boxed=use_boxed, format_score=format_score)


@register_score_fn("math_dapo")
@register_score_fn("aime", prefix=True)
def _score_math_dapo(solution_str, ground_truth, extra_info=None, strict_box_verify=False):
    return math_dapo.compute_score(solution_str, ground_truth, strict_box_verify=strict_box_verify)


@register_score_fn("arithmetic")
def _score_arithmetic(solution_str, ground_truth, extra_info=None, format_score=None, score=None):
    kwargs = {k: v for k, v in (("format_score", format_score), ("score", score)) if v is not None}
    return arithmetic.compute_score(solution_str, ground_truth, **kwargs)


@register_score_fn("countdown")
def _score_countdown(solution_str, ground_truth, extra_info=None, format_score=0.1, score=1.0):
    return countdown.compute_score(solution_str, ground_truth, format_score=format_score, score=score)


@register_score_fn("gsm_symbolic")
def _score_gsm_symbolic(solution_str, ground_truth, extra_info=None, format_score=0.0, score=1.0):
    return gsm_symbolic.compute_score(solution_str, ground_truth, format_score=format_score, score=score)


@register_score_fn(*sandbox_fusion.CODE_DATA_SOURCES)
def _score_code(solution_str, ground_truth, extra_info=None, sandbox_fusion_url=None, concurrent_semaphore=None,
                memory_limit_mb=1024, max_concurrent=64):
    """The share of the row's test cases the response's program passes (``sandbox_fusion``): on the Sandbox
    Fusion server ``reward_model.sandbox_fusion.url`` when set, else in a local subprocess."""
    return sandbox_fusion.compute_score(solution_str, ground_truth, sandbox_url=sandbox_fusion_url,
                                        memory_limit_mb=memory_limit_mb, max_concurrent=max_concurrent,
                                        semaphore=concurrent_semaphore)


# ---------------------------------------------------------------------------------------------- dispatch

def _accepted_kwargs(fn: ScoreFn, kwargs: dict) -> dict:
    """The subset of ``kwargs`` that ``fn`` accepts (verl passes sandbox options every scorer ignores)."""
    if not kwargs:
        return {}
    params = inspect.signature(fn).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return dict(kwargs)
    return {k: v for k, v in kwargs.items() if k in params}


def _as_score(result: Any, data_source: str) -> float | dict:
    if isinstance(result, dict):
        if "score" not in result:
            raise ValueError(f"the scorer for data_source={str(data_source)!r} returned a dict without a "
                             f"'score' key: {sorted(result)}")
        return {**result, "score": float(result["score"])}
    if isinstance(result, (list, tuple)):  # ambiguous: which element is the reward?
        raise TypeError(f"the scorer for data_source={str(data_source)!r} returned a {type(result).__name__} "
                        f"({result!r:.80}); return a float or a dict with 'score'")
    return float(result)


def default_compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> float | dict:
    """Score one response with the built-in scorer for ``data_source``.

    Raises ``UnknownDataSourceError`` (a ``NotImplementedError``) naming the data_source, the supported
    ones, and how to plug in your own function.
    """
    fn = require_score_fn(data_source)
    result = fn(solution_str, ground_truth, extra_info=extra_info, **_accepted_kwargs(fn, kwargs))
    return _as_score(result, data_source)


def is_default_scorer(fn: Any) -> bool:
    """Whether ``fn`` is :func:`default_compute_score`, also with options bound (``functools.partial``: the
    sandbox settings of ``reward_model.sandbox_fusion``)."""
    return fn is default_compute_score or (isinstance(fn, functools.partial) and fn.func is default_compute_score)


# Older verl releases and many recipes import the private name.
_default_compute_score = default_compute_score
