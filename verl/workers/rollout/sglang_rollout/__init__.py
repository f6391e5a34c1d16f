"""SGLang rollout (CUDA only; written against SGLang's offline ``sglang.Engine`` API, not verified on hardware).

Importing this package never imports SGLang; :class:`SGLangRollout` checks for SGLang and CUDA when built.
"""

from .sglang_rollout import SGLangRollout, check_sglang_available, sglang_sampling_params

__all__ = ["SGLangRollout", "check_sglang_available", "sglang_sampling_params"]
