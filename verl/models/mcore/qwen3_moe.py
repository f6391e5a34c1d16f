"""Qwen3-MoE (``Qwen3MoeForCausalLM``): a Llama-shaped decoder whose every MLP is a mixture of experts (softmax
router, top-k experts per token, weights renormalised over the k when ``norm_topk_prob``), with a per-head RMSNorm
of queries and keys, no attention biases and no shared expert."""

from verl.models.mcore.convert import ArchSpec

QWEN3_MOE = ArchSpec(name="qwen3_moe", qkv_bias=False, qk_norm=True, experts=True,
                     refuse_keys={"attention_bias": False, "use_sliding_window": False})
