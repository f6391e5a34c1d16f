"""Hugging Face <-> megatron-core conversion, one module per architecture (``qwen2``, ``llama``).

``get_arch(hf_config)`` returns the :class:`~verl.models.mcore.convert.ArchSpec` of a supported architecture or
raises naming the ones that are supported.
"""

from verl.models.mcore.convert import ArchSpec
from verl.models.mcore.llama import LLAMA
from verl.models.mcore.qwen2 import QWEN2

__all__ = ["ArchSpec", "SUPPORTED_ARCHITECTURES", "get_arch"]

SUPPORTED_ARCHITECTURES: dict[str, ArchSpec] = {
    "Qwen2ForCausalLM": QWEN2, "Qwen2ForTokenClassification": QWEN2,
    "LlamaForCausalLM": LLAMA, "LlamaForTokenClassification": LLAMA,
}
_BY_MODEL_TYPE = {"qwen2": QWEN2, "llama": LLAMA}


def get_arch(hf_config) -> ArchSpec:
    """The conversion spec for ``hf_config`` (by ``architectures``, else ``model_type``)."""
    for name in getattr(hf_config, "architectures", None) or []:
        if name in SUPPORTED_ARCHITECTURES:
            return SUPPORTED_ARCHITECTURES[name]
    archs = getattr(hf_config, "architectures", None)
    if not archs and getattr(hf_config, "model_type", None) in _BY_MODEL_TYPE:
        return _BY_MODEL_TYPE[hf_config.model_type]
    raise ValueError(f"the Megatron engine does not support the architecture {archs or hf_config.model_type!r}; "
                     f"supported: {', '.join(sorted(SUPPORTED_ARCHITECTURES))} (or use strategy=fsdp)")
