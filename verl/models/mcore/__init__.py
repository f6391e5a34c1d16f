"""Hugging Face <-> megatron-core conversion, one module per architecture (``qwen2``, ``llama``, and the
mixtures of experts ``qwen3_moe``, ``qwen2_moe`` and ``deepseek_v3``: DeepSeek-V3 / Moonlight, multi-latent
attention).

``get_arch(hf_config)`` returns the :class:`~verl.models.mcore.convert.ArchSpec` of a supported architecture or
raises naming the ones that are supported.
"""

from verl.models.mcore.convert import ArchSpec
from verl.models.mcore.deepseek_v3 import DEEPSEEK_V3
from verl.models.mcore.llama import LLAMA
from verl.models.mcore.qwen2 import QWEN2
from verl.models.mcore.qwen2_moe import QWEN2_MOE
from verl.models.mcore.qwen3_moe import QWEN3_MOE

__all__ = ["ArchSpec", "SUPPORTED_ARCHITECTURES", "get_arch"]

SUPPORTED_ARCHITECTURES: dict[str, ArchSpec] = {
    "Qwen2ForCausalLM": QWEN2, "Qwen2ForTokenClassification": QWEN2,
    "LlamaForCausalLM": LLAMA, "LlamaForTokenClassification": LLAMA,
    # reward models: the scalar head (score.weight) on the last stage, as the critic's
    "Qwen2ForSequenceClassification": QWEN2, "LlamaForSequenceClassification": LLAMA,
    "Qwen3MoeForCausalLM": QWEN3_MOE, "Qwen2MoeForCausalLM": QWEN2_MOE, "DeepseekV3ForCausalLM": DEEPSEEK_V3,
}
_BY_MODEL_TYPE = {"qwen2": QWEN2, "llama": LLAMA, "qwen3_moe": QWEN3_MOE, "qwen2_moe": QWEN2_MOE,
                  "deepseek_v3": DEEPSEEK_V3}


# architectures verl runs on Megatron that this engine does not convert, and what is missing
_NOT_CONVERTED = {
    "DeepseekV2ForCausalLM": "DeepSeek-V2's router (softmax scores, its topk_method) is not converted (DeepSeek-V3's "
                             "DeepseekV3ForCausalLM is)",
    "Qwen3VLMoeForConditionalGeneration": "the vision tower and its multimodal rotary positions are not converted",
}


def get_arch(hf_config) -> ArchSpec:
    """The conversion spec for ``hf_config`` (by ``architectures``, else ``model_type``)."""
    for name in getattr(hf_config, "architectures", None) or []:
        if name in SUPPORTED_ARCHITECTURES:
            return SUPPORTED_ARCHITECTURES[name]
    archs = getattr(hf_config, "architectures", None)
    if not archs and getattr(hf_config, "model_type", None) in _BY_MODEL_TYPE:
        return _BY_MODEL_TYPE[hf_config.model_type]
    why = next((f" ({_NOT_CONVERTED[a]})" for a in archs or [] if a in _NOT_CONVERTED), "")
    raise ValueError(f"the Megatron engine does not support the architecture {archs or hf_config.model_type!r}"
                     f"{why}; supported: {', '.join(sorted(SUPPORTED_ARCHITECTURES))} (or use strategy=fsdp)")
