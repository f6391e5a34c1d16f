"""Build a megatron-core ``GPTModel`` stage from a Hugging Face config, load HF weights into it, and stream
its weights back out under HF names (gathered over tensor ranks, broadcast over pipeline stages, one
parameter at a time: no rank ever holds a second full copy of the model).

With virtual pipeline stages a rank holds several model chunks (:func:`build_model_chunks`, see
:class:`ParallelLayout`); the functions here take either one ``GPTModel`` or the list of a rank's chunks.

Uses megatron-core's local layer spec (no Transformer Engine), so it runs wherever torch runs. Requires the
model-parallel state (``megatron.core.parallel_state``) to be initialised.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from verl.models.mcore import get_arch
from verl.models.mcore.convert import (HFWeights, Shapes, local_hf_pieces, model_rules, num_experts, padded_vocab_size,
                                       range_overlaps, rope_theta, shard, unshard)
from verl.models.mcore.deepseek_v3 import mla_submodules
from verl.models.mcore.experts import expert_owner, is_expert_kind, moe_transformer_fields
from verl.models.mcore.lora import merged_weight, weight_adapters
from verl.utils.device import collective_device, get_device

__all__ = ["ValueHead", "build_gpt_model", "build_model_chunks", "load_hf_weights", "iter_hf_params",
           "iter_hf_tp_shards", "ParallelLayout", "model_shapes", "as_chunks", "tag_tensor_parallel"]


class ParallelLayout:
    """This process's place in the model-parallel grid (read from megatron's parallel state).

    With ``vpp`` virtual pipeline stages (megatron's interleaved schedule) the model is cut into ``pp * vpp``
    virtual stages of equal layer counts; pipeline rank ``r`` holds ``vpp`` model chunks, chunk ``v`` being
    virtual stage ``v * pp + r``. ``first`` / ``last``: this rank holds the embedding (in its chunk 0) / the
    output layer (in its last chunk)."""

    def __init__(self, vpp: int = 1):
        # optional heavy dependency: megatron-core (~10 s to import) is needed only with strategy=megatron
        from megatron.core import parallel_state as ps

        self.tp = ps.get_tensor_model_parallel_world_size()
        self.tp_rank = ps.get_tensor_model_parallel_rank()
        self.pp = ps.get_pipeline_model_parallel_world_size()
        self.pp_rank = ps.get_pipeline_model_parallel_rank()
        self.tp_group = ps.get_tensor_model_parallel_group()
        self.pp_group = ps.get_pipeline_model_parallel_group()
        # experts (mixture-of-experts models): split over the expert-parallel group, each expert's weights cut over
        # the expert tensor-parallel group
        self.ep = ps.get_expert_model_parallel_world_size()
        self.ep_rank = ps.get_expert_model_parallel_rank()
        self.ep_group = ps.get_expert_model_parallel_group()
        self.etp = ps.get_expert_tensor_parallel_world_size()
        self.etp_rank = ps.get_expert_tensor_parallel_rank()
        self.etp_group = ps.get_expert_tensor_parallel_group()
        self.vpp = int(vpp)
        self.first = self.pp_rank == 0
        self.last = self.pp_rank == self.pp - 1

    def cut(self, kind: str):
        """(rank, size, group) of the tensor-parallel group a parameter of cut ``kind`` is split over."""
        if is_expert_kind(kind):
            return self.etp_rank, self.etp, self.etp_group
        return self.tp_rank, self.tp, self.tp_group

    def layers_per_chunk(self, num_layers: int) -> int:
        return num_layers // (self.pp * self.vpp)

    def chunk_offset(self, num_layers: int, chunk: int, pp_rank: int | None = None) -> int:
        """The global index of the first layer of model chunk ``chunk`` on pipeline rank ``pp_rank`` (this one)."""
        rank = self.pp_rank if pp_rank is None else pp_rank
        return (chunk * self.pp + rank) * self.layers_per_chunk(num_layers)

    def owner(self, num_layers: int, layer: int) -> tuple[int, int, int]:
        """(pipeline rank, model chunk, index in that chunk) of global layer ``layer``."""
        virtual_stage, local = divmod(layer, self.layers_per_chunk(num_layers))
        chunk, rank = divmod(virtual_stage, self.pp)
        return rank, chunk, local

    def has_input(self, chunk: int) -> bool:
        """Whether model chunk ``chunk`` of this rank holds the embedding (the model's first virtual stage)."""
        return self.first and chunk == 0

    def has_output(self, chunk: int) -> bool:
        """Whether model chunk ``chunk`` of this rank holds the output layer (the model's last virtual stage)."""
        return self.last and chunk == self.vpp - 1


def as_chunks(model) -> list:
    """A model given as one ``GPTModel`` or as the list of this rank's model chunks, as that list."""
    return list(model) if isinstance(model, (list, tuple, nn.ModuleList)) else [model]


class ValueHead(nn.Module):
    """The critic's scalar head in place of ``output_layer``: replicated on every tensor rank (its output is
    computed from the full, sequence-gathered hidden states, so its gradients need no reduction)."""

    def __init__(self, hidden_size: int, sequence_parallel: bool, dtype: torch.dtype):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(1, hidden_size, dtype=dtype))
        self.bias = nn.Parameter(torch.zeros(1, dtype=dtype))
        self.sequence_parallel = sequence_parallel

    def forward(self, hidden_states, weight=None, runtime_gather_output=None):
        if self.sequence_parallel:
            # optional heavy dependency: megatron-core (~10 s to import) is needed only with strategy=megatron
            from megatron.core.tensor_parallel import gather_from_sequence_parallel_region

            hidden_states = gather_from_sequence_parallel_region(hidden_states, tensor_parallel_output_grad=False)
        return F.linear(hidden_states, self.weight, self.bias), None


class RMSNorm(nn.Module):
    """HF's RMSNorm (statistics in fp32) as a megatron layer-norm module. megatron's torch-only norm refuses
    sequence parallel; this one marks its weight ``sequence_parallel`` so the engine sums its gradient over the
    tensor ranks (each rank normalises only its slice of the sequence)."""

    def __init__(self, config, hidden_size: int, eps: float = 1e-6, **kwargs):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=config.params_dtype))
        self.eps = float(eps)
        self.weight.sequence_parallel = bool(config.sequence_parallel)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


class HeadRMSNorm(RMSNorm):
    """:class:`RMSNorm` of each query / key head (Qwen3's q_norm / k_norm). Each tensor rank normalises only its own
    heads with the one shared weight, so the engine sums its gradient over the tensor ranks."""

    def __init__(self, config, hidden_size: int, eps: float = 1e-6, **kwargs):
        super().__init__(config, hidden_size, eps, **kwargs)
        self.weight.sequence_parallel = False
        self.weight.sum_grad_over_tp = True


def _layer_spec(arch, experts: int | None):
    """megatron's local GPT layer spec with :class:`RMSNorm` in every norm slot (``arch``'s query / key norms, or
    multi-latent attention's ``q_layernorm`` / ``kv_layernorm``); a mixture-of-experts MLP with ``experts``."""
    # optional heavy dependency: megatron-core (~10 s to import) is needed only with strategy=megatron
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    qk_norm = bool(arch is not None and arch.qk_norm)
    mla = bool(arch is not None and arch.mla)
    layer = get_gpt_layer_local_spec(num_experts=experts, qk_layernorm=qk_norm or mla, multi_latent_attention=mla,
                                     normalization="RMSNorm")
    sub = dataclasses.replace(layer.submodules, input_layernorm=RMSNorm, pre_mlp_layernorm=RMSNorm)
    # multi-latent attention: its low-rank query / key-value norms, core attention and down projections
    norms = {"q_layernorm": RMSNorm, "kv_layernorm": RMSNorm, **mla_submodules()} if mla else \
        {"q_layernorm": HeadRMSNorm, "k_layernorm": HeadRMSNorm} if qk_norm else {}
    if norms:
        attn = sub.self_attention
        sub = dataclasses.replace(sub, self_attention=dataclasses.replace(attn, submodules=dataclasses.replace(
            attn.submodules, **norms)))
    return dataclasses.replace(layer, submodules=sub)


def _block_spec(num_layers: int, hf_config=None, offset: int = 0):
    """The layer specs of ``num_layers`` decoder layers starting at global layer ``offset`` (with ``hf_config``:
    each layer a mixture of experts or dense as its architecture says)."""
    # optional heavy dependency: megatron-core (~10 s to import) is needed only with strategy=megatron
    from megatron.core.transformer.transformer_block import TransformerBlockSubmodules

    arch = get_arch(hf_config) if hf_config is not None else None
    experts = num_experts(hf_config) if arch is not None and arch.experts else None
    moe = [bool(experts) and arch.is_moe_layer(hf_config, offset + i) for i in range(num_layers)]
    specs = {kind: _layer_spec(arch, experts if kind else None) for kind in set(moe)}
    layers = [specs[kind] for kind in moe]
    return TransformerBlockSubmodules(layer_specs=layers, layer_norm=RMSNorm)


def model_shapes(hf_config, tp: int) -> Shapes:
    heads = hf_config.num_attention_heads
    head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // heads
    return Shapes(num_query_groups=getattr(hf_config, "num_key_value_heads", None) or heads, head_dim=head_dim,
                  vocab_size=hf_config.vocab_size, padded_vocab=padded_vocab_size(hf_config.vocab_size, tp))


def transformer_config(hf_config, *, tp: int, pp: int, sequence_parallel: bool, dtype: torch.dtype,
                       use_cpu_initialization: bool = True, overrides: dict | None = None, vpp: int = 1):
    """megatron-core's ``TransformerConfig`` for ``hf_config``; ``overrides`` (the role's
    ``megatron.override_transformer_config``, checked by ``settings.transformer_overrides``) replace fields."""
    # optional heavy dependency: megatron-core (~10 s to import) is needed only with strategy=megatron
    from megatron.core.transformer import MLATransformerConfig, TransformerConfig

    arch = get_arch(hf_config)
    shapes = model_shapes(hf_config, tp)
    fields = dict(
        num_layers=hf_config.num_hidden_layers, hidden_size=hf_config.hidden_size,
        num_attention_heads=hf_config.num_attention_heads, num_query_groups=shapes.num_query_groups,
        kv_channels=shapes.head_dim, ffn_hidden_size=hf_config.intermediate_size,
        normalization="RMSNorm", layernorm_epsilon=float(hf_config.rms_norm_eps), gated_linear_unit=True,
        activation_func=F.silu, add_bias_linear=False, add_qkv_bias=arch.qkv_bias,
        hidden_dropout=0.0, attention_dropout=0.0, bias_activation_fusion=False, bias_dropout_fusion=False,
        masked_softmax_fusion=False, persist_layer_norm=False, apply_rope_fusion=False,
        gradient_accumulation_fusion=False, attention_softmax_in_fp32=True,
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp, sequence_parallel=sequence_parallel,
        virtual_pipeline_model_parallel_size=vpp if vpp > 1 else None,
        params_dtype=dtype, pipeline_dtype=dtype, bf16=dtype == torch.bfloat16, fp16=dtype == torch.float16,
        use_cpu_initialization=use_cpu_initialization, perform_initialization=False,
        init_method_std=float(getattr(hf_config, "initializer_range", 0.02)),
    )
    fields.update(moe_transformer_fields(hf_config, arch))
    fields.update(arch.transformer_fields(hf_config))
    fields.update(overrides or {})
    return (MLATransformerConfig if arch.mla else TransformerConfig)(**fields)


def build_gpt_model(hf_config, *, value_head: bool, sequence_parallel: bool, dtype: torch.dtype,
                    use_cpu_initialization: bool = True, overrides: dict | None = None, vpp: int = 1,
                    vp_stage: int = 0) -> nn.Module:
    """This stage's ``GPTModel`` (weights uninitialised: load them with :func:`load_hf_weights`); with ``vpp``
    virtual pipeline stages, its model chunk ``vp_stage`` (see :class:`ParallelLayout`)."""
    # optional heavy dependency: megatron-core (~10 s to import) is needed only with strategy=megatron
    from megatron.core.models.gpt import GPTModel

    layout = ParallelLayout(vpp)
    arch = get_arch(hf_config)
    arch.check(hf_config)
    config = transformer_config(hf_config, tp=layout.tp, pp=layout.pp, sequence_parallel=sequence_parallel,
                                dtype=dtype, use_cpu_initialization=use_cpu_initialization, overrides=overrides,
                                vpp=vpp)
    pre, post = layout.has_input(vp_stage), layout.has_output(vp_stage)
    tied = bool(getattr(hf_config, "tie_word_embeddings", False)) and not value_head
    # Tied embeddings over several stages: the last stage gets its own output layer (loaded from the
    # embedding, gradients summed with the first stage's by the engine). megatron's own tying moves the copy
    # to CUDA while building, which fails on CPU.
    model = GPTModel(config=config,
                     transformer_layer_spec=_block_spec(layout.layers_per_chunk(hf_config.num_hidden_layers),
                                                       hf_config,
                                                       layout.chunk_offset(hf_config.num_hidden_layers, vp_stage)),
                     vocab_size=padded_vocab_size(hf_config.vocab_size, layout.tp),
                     max_sequence_length=int(hf_config.max_position_embeddings), pre_process=pre,
                     post_process=post, parallel_output=True,
                     share_embeddings_and_output_weights=tied and layout.pp == 1,
                     position_embedding_type="rope", rotary_base=rope_theta(hf_config),
                     vp_stage=vp_stage if vpp > 1 else None)
    if tied and layout.pp > 1 and post:
        model.output_layer.weight.shared = True
        model.output_layer.weight.shared_embedding = True
    if value_head and post:
        model.output_layer = ValueHead(hf_config.hidden_size, sequence_parallel, dtype)
    if not use_cpu_initialization:
        # megatron's own layers are built on the accelerator; our norms and value head start on the host
        model = model.to(get_device())
    return model


def build_model_chunks(hf_config, *, vpp: int = 1, **kwargs) -> list[nn.Module]:
    """This pipeline rank's ``vpp`` model chunks in virtual-stage order (one ``GPTModel`` without virtual
    stages); ``kwargs`` as :func:`build_gpt_model`'s. megatron's virtual-stage rank is set while each is built."""
    # optional heavy dependency: megatron-core (~10 s to import) is needed only with strategy=megatron
    from megatron.core import parallel_state as ps

    if vpp == 1:
        return [build_gpt_model(hf_config, **kwargs)]
    chunks = []
    for v in range(vpp):
        ps.set_virtual_pipeline_model_parallel_rank(v)
        chunks.append(build_gpt_model(hf_config, vpp=vpp, vp_stage=v, **kwargs))
    ps.set_virtual_pipeline_model_parallel_rank(0)
    return chunks


def _local_rules(hf_config, layout: ParallelLayout, value_head: bool, chunk: int = 0):
    """(mcore name, HF names, cut) of every parameter model chunk ``chunk`` of this stage holds."""
    arch = get_arch(hf_config)
    per_stage = layout.layers_per_chunk(hf_config.num_hidden_layers)
    offset = layout.chunk_offset(hf_config.num_hidden_layers, chunk)
    tied = bool(getattr(hf_config, "tie_word_embeddings", False))
    out = []
    for rule in model_rules(first=layout.has_input(chunk), last=layout.has_output(chunk), tied=tied,
                            value_head=value_head):
        out.append((rule.mcore, rule.hf, rule.kind))
    for i in range(per_stage):
        for rule in arch.rules_of_layer(hf_config, offset + i):
            mcore = rule.mcore
            if rule.expert >= 0:  # an expert: held by one expert-parallel rank, under its local index
                owner, mcore = expert_owner(rule, hf_config, layout.ep)
                if owner != layout.ep_rank:
                    continue
            out.append((f"decoder.layers.{i}.{mcore}", tuple(f"model.layers.{offset + i}.{h}" for h in rule.hf),
                        rule.kind))
    return out


def tag_tensor_parallel(model, hf_config, value_head: bool) -> None:
    """Mark each parameter ``tensor_model_parallel`` from its cut. megatron tags split parameters only when it
    initialises them itself; the engine's gradient norm counts replicated ones on tensor rank 0 only."""
    chunks = as_chunks(model)
    layout = ParallelLayout(len(chunks))
    for v, chunk in enumerate(chunks):
        params = dict(chunk.named_parameters())
        for name, _, kind in _local_rules(hf_config, layout, value_head, v):
            if name in params:
                params[name].tensor_model_parallel = kind != "rep" and layout.cut(kind)[1] > 1
                # experts' gradients are averaged over the expert data-parallel group, not the data-parallel one
                params[name].is_expert = is_expert_kind(kind)


@torch.no_grad()
def load_hf_weights(model, model_dir: str, hf_config, value_head: bool) -> None:
    """Fill this stage's parameters (``model``: a ``GPTModel`` or this rank's model chunks) from an HF safetensors
    directory (each rank reads only the tensors of its own layers, one at a time). A critic's value head missing
    from the checkpoint starts at zero."""
    chunks = as_chunks(model)
    for v, chunk in enumerate(chunks):
        _load_chunk(chunk, v, len(chunks), model_dir, hf_config, value_head)
    tag_tensor_parallel(chunks, hf_config, value_head)


@torch.no_grad()
def _load_chunk(chunk: nn.Module, v: int, vpp: int, model_dir: str, hf_config, value_head: bool) -> None:
    layout = ParallelLayout(vpp)
    shapes = model_shapes(hf_config, layout.tp)
    weights = HFWeights(model_dir)
    arch = get_arch(hf_config)
    params = dict(chunk.named_parameters())
    tensors = {**_weight_buffers(chunk), **params}
    seen = set()
    for name, hf_names, kind in _local_rules(hf_config, layout, value_head, v):
        if name not in tensors:
            continue
        if value_head and hf_names[0].startswith("score.") and hf_names[0] not in weights:
            params[name].zero_()
        else:
            hf = [arch.to_mcore(hf_config, h, weights.get(h)) for h in hf_names]
            rank, size, _ = layout.cut(kind)
            local = shard(kind, hf, rank, size, shapes)
            if tuple(local.shape) != tuple(tensors[name].shape):
                raise ValueError(f"{model_dir}: {hf_names} gives {tuple(local.shape)} for {name}, expected "
                                 f"{tuple(tensors[name].shape)} (does config.json match the weights?)")
            tensors[name].copy_(local.to(tensors[name].dtype))
        seen.add(name)
    missing = [n for n in params if n not in seen]
    if missing:
        raise ValueError(f"the HF->Megatron map has no source for {missing}")


_WIRE_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


def _weight_buffers(chunk: nn.Module) -> dict:
    """Buffers that are checkpoint weights (DeepSeek's router ``expert_bias``: HF's ``e_score_correction_bias``)."""
    return {n: b for n, b in chunk.named_buffers() if n.endswith("router.expert_bias")}


def _broadcast_from(tensor: torch.Tensor | None, src_stage: int, layout: ParallelLayout, dtype) -> torch.Tensor:
    """Send a stage's tensor to every stage of this pipeline (shape first, then data)."""
    return _broadcast_in(tensor, src_stage, layout.pp_rank, layout.pp, layout.pp_group, dtype)


def _broadcast_in(tensor: torch.Tensor | None, src: int, me: int, size: int, group, dtype) -> torch.Tensor:
    """Send the tensor of group rank ``src`` to every rank of ``group`` (shape first, then data)."""
    if size == 1:
        return tensor
    src_global = dist.get_global_rank(group, src)
    dev = collective_device(group)
    header = torch.zeros(6, dtype=torch.int64, device=dev)
    if me == src:
        header[0] = tensor.dim()
        header[1 : 1 + tensor.dim()] = torch.tensor(tensor.shape)
        # a tensor kept in another dtype than the model's (DeepSeek's fp32 expert bias) travels as it is
        header[5] = _WIRE_DTYPES.index(tensor.dtype) + 1 if tensor.dtype in _WIRE_DTYPES else 0
    dist.broadcast(header, src=src_global, group=group)
    shape = tuple(int(x) for x in header[1 : 1 + int(header[0])])
    dtype = _WIRE_DTYPES[int(header[5]) - 1] if int(header[5]) else dtype
    buf = tensor.contiguous() if me == src else torch.empty(shape, dtype=dtype, device=dev)
    dist.broadcast(buf, src=src_global, group=group)
    return buf


def _walk_stages(chunks: list[nn.Module], hf_config, layout: ParallelLayout, stats: dict, stage_tensors, *,
                 value_head: bool, tied_head: bool) -> Iterator[tuple[str, torch.Tensor]]:
    """Every weight of the model in HF order: the owning stage makes its tensors with
    ``stage_tensors(chunk, name, kind)`` (one per HF name of the mcore parameter ``name`` of its model chunk
    ``chunk``) and broadcasts them over the pipeline, counting received bytes in ``stats["recv_bytes"]``.
    ``tied_head``: a tied output layer is also sent, as ``lm_head.weight`` made from the embedding (``False``: not
    sent)."""
    arch = get_arch(hf_config)
    dtype = next(chunks[0].parameters()).dtype
    tied = bool(getattr(hf_config, "tie_word_embeddings", False)) and not value_head
    last_chunk = layout.vpp - 1

    def emit(stage: int, chunk: int, name: str, hf_names: tuple, kind: str, expert_owner_rank: int | None = None):
        # an expert's tensors start on one expert-parallel rank of the stage (``expert_owner_rank``)
        here = layout.pp_rank == stage and expert_owner_rank in (None, layout.ep_rank)
        tensors = stage_tensors(chunk, name, kind) if here else [None] * len(hf_names)
        for hf_name, t in zip(hf_names, tensors):
            if expert_owner_rank is not None and layout.pp_rank == stage and layout.ep > 1:
                t = _broadcast_in(t, expert_owner_rank, layout.ep_rank, layout.ep, layout.ep_group, dtype)
                if layout.ep_rank != expert_owner_rank:
                    stats["recv_bytes"] += t.numel() * t.element_size()
            out = _broadcast_from(t, stage, layout, dtype)
            if layout.pp_rank != stage:
                stats["recv_bytes"] += out.numel() * out.element_size()
            yield hf_name, arch.to_hf(hf_config, hf_name, out)

    yield from emit(0, 0, "embedding.word_embeddings.weight", ("model.embed_tokens.weight",), "vocab")
    for g in range(hf_config.num_hidden_layers):
        stage, chunk, local_index = layout.owner(hf_config.num_hidden_layers, g)
        for rule in arch.rules_of_layer(hf_config, g):
            owner, mcore = expert_owner(rule, hf_config, layout.ep) if rule.expert >= 0 else (None, rule.mcore)
            yield from emit(stage, chunk, f"decoder.layers.{local_index}.{mcore}",
                            tuple(f"model.layers.{g}.{h}" for h in rule.hf), rule.kind, owner)
    last = layout.pp - 1
    yield from emit(last, last_chunk, "decoder.final_layernorm.weight", ("model.norm.weight",), "rep")
    if value_head:
        yield from emit(last, last_chunk, "output_layer.weight", ("score.weight",), "rep")
        yield from emit(last, last_chunk, "output_layer.bias", ("score.bias",), "rep")
    elif tied:
        if tied_head:
            yield from emit(0, 0, "embedding.word_embeddings.weight", ("lm_head.weight",), "vocab")
    else:
        yield from emit(last, last_chunk, "output_layer.weight", ("lm_head.weight",), "vocab")


@torch.no_grad()
def iter_hf_params(model, hf_config, value_head: bool, stats: dict | None = None
                   ) -> Iterator[tuple[str, torch.Tensor]]:
    """Every weight under its HF name, full size, on every rank (collective: all ranks iterate together).

    Per parameter: the owning stage gathers the tensor-rank pieces and rebuilds the HF tensors, then
    broadcasts them over the pipeline. Tied causal LMs also yield ``lm_head.weight`` (rollout engines need it).
    ``stats["recv_bytes"]`` counts what this rank received from other ranks.
    """
    stats = stats if stats is not None else {}
    stats["recv_bytes"] = 0
    chunks = as_chunks(model)
    layout = ParallelLayout(len(chunks))
    shapes = model_shapes(hf_config, layout.tp)
    params = [{**_weight_buffers(c), **dict(c.named_parameters())} for c in chunks]
    adapters = [weight_adapters(c) for c in chunks]  # LoRA: adapted weights go out merged, W + scale * B @ A

    def gathered(chunk: int, name: str, kind: str) -> list[torch.Tensor]:
        local = merged_weight(adapters[chunk], name, params[chunk][name].detach())
        _, size, group = layout.cut(kind)  # experts: the expert tensor-parallel group
        if size == 1 or kind == "rep":
            return unshard(kind, [local], shapes)
        parts = [torch.empty_like(local) for _ in range(size)]
        dist.all_gather(parts, local.contiguous(), group=group)
        stats["recv_bytes"] += (size - 1) * local.numel() * local.element_size()
        return unshard(kind, parts, shapes)

    yield from _walk_stages(chunks, hf_config, layout, stats, gathered, value_head=value_head, tied_head=True)


@torch.no_grad()
def iter_hf_tp_shards(model, hf_config, vocab_range: tuple[int, int],
                      stats: dict | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """Every weight under its HF name as **this tensor rank's piece**, laid out as an inference engine with the
    same tensor-parallel size holds it (collective: all ranks iterate together).

    No tensor-parallel weight is gathered: q/k/v and gate/up are cut out of the rank's own fused shard; the
    vocabulary rows are regrouped inside the tensor group to the engine's row range ``vocab_range`` (engines pad
    the vocabulary differently from Megatron's multiple of 128; each rank receives only the rows it lacks);
    replicated weights (norms) are the rank's own. With pipeline stages, a stage sends its layers' pieces to the
    same tensor rank of the other stages. Tied output layers are not sent (the engine shares the embedding).
    ``stats["recv_bytes"]`` counts what this rank received from other ranks.
    """
    if get_arch(hf_config).experts:
        raise NotImplementedError(f"{get_arch(hf_config).name}: per-rank weight pieces are not made for "
                                  "mixture-of-experts models; push full tensors (iter_hf_params)")
    chunks = as_chunks(model)
    layout = ParallelLayout(len(chunks))
    shapes = model_shapes(hf_config, layout.tp)
    params = [dict(c.named_parameters()) for c in chunks]
    adapters = [weight_adapters(c) for c in chunks]  # LoRA: each rank's piece of W + scale * B @ A
    stats = stats if stats is not None else {}
    stats["recv_bytes"] = 0
    dev = collective_device(layout.tp_group)

    rows = shapes.padded_vocab // layout.tp
    have = [(s * rows, min((s + 1) * rows, shapes.vocab_size)) for s in range(layout.tp)]
    wanted = torch.tensor(vocab_range, dtype=torch.int64, device=dev)
    gathered_wants = [torch.empty_like(wanted) for _ in range(layout.tp)]
    dist.all_gather(gathered_wants, wanted, group=layout.tp_group)
    plan = range_overlaps(have, [tuple(int(x) for x in w) for w in gathered_wants])
    me = layout.tp_rank

    def vocab_rows(local: torch.Tensor) -> torch.Tensor:
        if layout.tp == 1:
            return local[vocab_range[0]: vocab_range[1]]
        send = [local[a - me * rows: b - me * rows] for a, b in plan[me]]
        out_splits = [plan[s][me][1] - plan[s][me][0] for s in range(layout.tp)]
        out = local.new_empty(sum(out_splits), *local.shape[1:])
        dist.all_to_all_single(out, torch.cat(send).contiguous(), out_splits, [b - a for a, b in plan[me]],
                               group=layout.tp_group)
        stats["recv_bytes"] += (sum(out_splits) - out_splits[me]) * out[0].numel() * out.element_size()
        return out

    def own_pieces(chunk: int, name: str, kind: str) -> list[torch.Tensor]:
        local = merged_weight(adapters[chunk], name, params[chunk][name].detach())
        return [vocab_rows(local)] if kind == "vocab" else local_hf_pieces(kind, local, shapes, layout.tp)

    yield from _walk_stages(chunks, hf_config, layout, stats, own_pieces, value_head=False, tied_head=False)
