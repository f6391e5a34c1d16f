"""Mixture-of-experts pieces of the HF <-> megatron-core model: the ``TransformerConfig`` fields of an MoE
architecture and where each expert's weights live in the expert-parallel grid.

megatron-core's MoE layer (local spec: ``TopKRouter``, ``SequentialMLP`` experts, a token dispatcher) routes as
Hugging Face's Qwen MoE blocks do: softmax over the router logits, the top ``num_experts_per_tok`` experts per token,
their weights renormalised over the k when ``norm_topk_prob`` (megatron: top-k of the logits, then softmax over
the k -- the same numbers) and used as they are otherwise (megatron's ``moe_router_pre_softmax``). With expert
parallel size ``ep`` the experts are split into ``ep`` equal groups, expert-parallel rank ``r`` holding the global
experts ``r * n_local .. (r + 1) * n_local - 1``; tokens travel to their experts and back with all-to-all (gloo
supports it) or all-gather, as ``moe_token_dispatcher_type`` says.

Defaults follow verl's converter (``verl/models/mcore/config_converter.py`` of v0.7.0): the load-balancing loss is
off (``moe_router_load_balancing_type="none"``: it hurts RL), ``moe_aux_loss_coeff`` is the HF config's
``router_aux_loss_coef`` and applies when ``override_transformer_config.moe_router_load_balancing_type=aux_loss``
turns it on. Every override of ``<role>.megatron.override_transformer_config`` replaces these.
"""

from __future__ import annotations

from verl.models.mcore.convert import EXPERT_KINDS, Rule, num_experts

__all__ = ["moe_transformer_fields", "expert_owner", "is_expert_kind"]


def moe_transformer_fields(hf_config, arch) -> dict:
    """The ``TransformerConfig`` fields of ``arch``'s attention norms and experts (empty for a dense Llama-shaped
    model); the expert-parallel sizes come from megatron's parallel state."""
    fields = {"qk_layernorm": True} if arch.qk_norm else {}
    if not arch.experts:
        return fields
    # optional heavy dependency: megatron-core (~10 s to import) is needed only with strategy=megatron
    from megatron.core import parallel_state as ps

    fields.update(
        num_moe_experts=num_experts(hf_config), moe_ffn_hidden_size=int(hf_config.moe_intermediate_size),
        moe_router_topk=int(hf_config.num_experts_per_tok), moe_router_score_function="softmax",
        moe_router_pre_softmax=not bool(getattr(hf_config, "norm_topk_prob", False)),
        moe_router_load_balancing_type="none",
        moe_aux_loss_coeff=float(getattr(hf_config, "router_aux_loss_coef", 0.0) or 0.0),
        moe_token_dispatcher_type="alltoall", moe_grouped_gemm=False,
        expert_model_parallel_size=ps.get_expert_model_parallel_world_size(),
        expert_tensor_parallel_size=ps.get_expert_tensor_parallel_world_size(),
    )
    if arch.shared_expert:
        fields.update(moe_shared_expert_intermediate_size=int(hf_config.shared_expert_intermediate_size),
                      moe_shared_expert_gate=True)
    return fields


def is_expert_kind(kind: str) -> bool:
    return kind in EXPERT_KINDS


def expert_owner(rule: Rule, hf_config, ep: int) -> tuple[int, str]:
    """(expert-parallel rank holding ``rule``'s expert, its mcore name there: the local expert index filled in)."""
    local = num_experts(hf_config) // ep
    owner, index = divmod(rule.expert, local)
    return owner, rule.mcore.format(local=index)
