r"""Symbolic answer checking with Hugging Face's ``math-verify`` package.

``math-verify`` parses LaTeX / plain expressions into sympy and compares them symbolically, so
``\frac{2}{4}``, ``0.5`` and ``1/2`` all match, as do equivalent sets, intervals and matrices. It guards
its own work with ``signal.alarm`` timeouts, which only work in a process's main thread; off the main
thread (Ray actors' worker threads, thread pools) we run without its timeout and rely on the caller's
(e.g. the ``prime`` reward manager's per-sample timeout).
"""

from __future__ import annotations

import threading


def _timeout_arg(seconds: int | None) -> int | None:
    return seconds if threading.current_thread() is threading.main_thread() else None


def _math_verify():
    """The ``math_verify`` package, imported on first use."""
    try:
        # optional heavy dependency: math-verify loads sympy and its LaTeX parser (~1 s); importing this scorer
        # package stays cheap, and only answers that fail the exact string comparison reach it
        import math_verify
    except ImportError as e:  # pragma: no cover - math-verify is in requirements.txt
        raise ImportError("math-verify is not installed: pip install math-verify (it is in requirements.txt)") from e
    return math_verify


def is_equiv(prediction: str, ground_truth: str, timeout_seconds: int = 5) -> bool:
    """Symbolic equivalence of two answer strings (either may be LaTeX, boxed or plain)."""
    mv = _math_verify()
    t = _timeout_arg(timeout_seconds)
    gold_text = str(ground_truth)
    if "\\boxed" not in gold_text and "$" not in gold_text:
        gold_text = "\\boxed{" + gold_text + "}"
    gold = mv.parse(gold_text, extraction_config=[mv.LatexExtractionConfig(), mv.ExprExtractionConfig()],
                    parsing_timeout=t)
    pred = mv.parse(str(prediction), extraction_config=[mv.LatexExtractionConfig(), mv.ExprExtractionConfig()],
                    parsing_timeout=t)
    if not gold or not pred:
        return False
    return bool(mv.verify(gold, pred, timeout_seconds=t))


def compute_score(model_output: str, ground_truth: str, timeout_score: float = 0.0) -> float:
    r"""1.0 when the final answer of ``model_output`` (its last ``\boxed{}`` or final expression) is
    symbolically equal to ``ground_truth``; ``timeout_score`` if math-verify times out; 0.0 otherwise."""
    timeout_exception = _math_verify().errors.TimeoutException
    try:
        return 1.0 if is_equiv(model_output, ground_truth) else 0.0
    except timeout_exception:
        return float(timeout_score)
    except Exception:  # unparsable text is a wrong answer, not a crash of the reward loop
        return 0.0
