"""Build a megatron-core ``GPTModel`` stage from a Hugging Face config, load HF weights into it, and stream
its weights back out under HF names (gathered over tensor ranks, broadcast over pipeline stages, one
parameter at a time: no rank ever holds a second full copy of the model).

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
from verl.models.mcore.convert import (HFWeights, Shapes, layer_rules, local_hf_pieces, model_rules,
                                       padded_vocab_size, range_overlaps, rope_theta, shard, unshard)
from verl.utils.device import collective_device, get_device

__all__ = ["ValueHead", "build_gpt_model", "load_hf_weights", "iter_hf_params", "iter_hf_tp_shards", "ParallelLayout",
           "model_shapes"]


class ParallelLayout:
    """This process's place in the model-parallel grid (read from megatron's parallel state)."""

    def __init__(self):
        # optional heavy dependency: megatron-core (~10 s to import) is needed only with strategy=megatron
        from megatron.core import parallel_state as ps

        self.tp = ps.get_tensor_model_parallel_world_size()
        self.tp_rank = ps.get_tensor_model_parallel_rank()
        self.pp = ps.get_pipeline_model_parallel_world_size()
        self.pp_rank = ps.get_pipeline_model_parallel_rank()
        self.tp_group = ps.get_tensor_model_parallel_group()
        self.pp_group = ps.get_pipeline_model_parallel_group()
        self.first = self.pp_rank == 0
        self.last = self.pp_rank == self.pp - 1


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


def _block_spec(num_layers: int):
    """megatron's local GPT layer spec with :class:`RMSNorm` in every norm slot, for ``num_layers`` layers."""
    # optional heavy dependency: megatron-core (~10 s to import) is needed only with strategy=megatron
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_block import TransformerBlockSubmodules

    layer = get_gpt_layer_local_spec(normalization="RMSNorm")
    layer = dataclasses.replace(layer, submodules=dataclasses.replace(layer.submodules, input_layernorm=RMSNorm,
                                                                      pre_mlp_layernorm=RMSNorm))
    return TransformerBlockSubmodules(layer_specs=[layer] * num_layers, layer_norm=RMSNorm)


def model_shapes(hf_config, tp: int) -> Shapes:
    heads = hf_config.num_attention_heads
    head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // heads
    return Shapes(num_query_groups=getattr(hf_config, "num_key_value_heads", None) or heads, head_dim=head_dim,
                  vocab_size=hf_config.vocab_size, padded_vocab=padded_vocab_size(hf_config.vocab_size, tp))


def transformer_config(hf_config, *, tp: int, pp: int, sequence_parallel: bool, dtype: torch.dtype,
                       use_cpu_initialization: bool = True, overrides: dict | None = None):
    """megatron-core's ``TransformerConfig`` for ``hf_config``; ``overrides`` (the role's
    ``megatron.override_transformer_config``, checked by ``settings.transformer_overrides``) replace fields."""
    # optional heavy dependency: megatron-core (~10 s to import) is needed only with strategy=megatron
    from megatron.core.transformer import TransformerConfig

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
        params_dtype=dtype, pipeline_dtype=dtype, bf16=dtype == torch.bfloat16, fp16=dtype == torch.float16,
        use_cpu_initialization=use_cpu_initialization, perform_initialization=False,
        init_method_std=float(getattr(hf_config, "initializer_range", 0.02)),
    )
    fields.update(overrides or {})
    return TransformerConfig(**fields)


def build_gpt_model(hf_config, *, value_head: bool, sequence_parallel: bool, dtype: torch.dtype,
                    use_cpu_initialization: bool = True, overrides: dict | None = None) -> nn.Module:
    """This stage's ``GPTModel`` (weights uninitialised: load them with :func:`load_hf_weights`)."""
    # optional heavy dependency: megatron-core (~10 s to import) is needed only with strategy=megatron
    from megatron.core.models.gpt import GPTModel

    layout = ParallelLayout()
    arch = get_arch(hf_config)
    arch.check(hf_config)
    config = transformer_config(hf_config, tp=layout.tp, pp=layout.pp, sequence_parallel=sequence_parallel,
                                dtype=dtype, use_cpu_initialization=use_cpu_initialization, overrides=overrides)
    tied = bool(getattr(hf_config, "tie_word_embeddings", False)) and not value_head
    # Tied embeddings over several stages: the last stage gets its own output layer (loaded from the
    # embedding, gradients summed with the first stage's by the engine). megatron's own tying moves the copy
    # to CUDA while building, which fails on CPU.
    model = GPTModel(config=config, transformer_layer_spec=_block_spec(hf_config.num_hidden_layers // layout.pp),
                     vocab_size=padded_vocab_size(hf_config.vocab_size, layout.tp),
                     max_sequence_length=int(hf_config.max_position_embeddings), pre_process=layout.first,
                     post_process=layout.last, parallel_output=True,
                     share_embeddings_and_output_weights=tied and layout.pp == 1,
                     position_embedding_type="rope", rotary_base=rope_theta(hf_config))
    if tied and layout.pp > 1 and layout.last:
        model.output_layer.weight.shared = True
        model.output_layer.weight.shared_embedding = True
    if value_head and layout.last:
        model.output_layer = ValueHead(hf_config.hidden_size, sequence_parallel, dtype)
    if not use_cpu_initialization:
        # megatron's own layers are built on the accelerator; our norms and value head start on the host
        model = model.to(get_device())
    return model


def _layer_offset(hf_config, layout: ParallelLayout) -> int:
    return layout.pp_rank * (hf_config.num_hidden_layers // layout.pp)


def _local_rules(hf_config, layout: ParallelLayout, value_head: bool):
    """(mcore name, HF names, cut) of every parameter this stage holds."""
    arch = get_arch(hf_config)
    per_stage = hf_config.num_hidden_layers // layout.pp
    offset = _layer_offset(hf_config, layout)
    tied = bool(getattr(hf_config, "tie_word_embeddings", False))
    out = []
    for rule in model_rules(first=layout.first, last=layout.last, tied=tied, value_head=value_head):
        out.append((rule.mcore, rule.hf, rule.kind))
    for i in range(per_stage):
        for rule in layer_rules(arch):
            out.append((f"decoder.layers.{i}.{rule.mcore}", tuple(f"model.layers.{offset + i}.{h}" for h in rule.hf),
                        rule.kind))
    return out


@torch.no_grad()
def load_hf_weights(model: nn.Module, model_dir: str, hf_config, value_head: bool) -> None:
    """Fill this stage's parameters from an HF safetensors directory (each rank reads only the tensors of its
    own layers, one at a time). A critic's value head missing from the checkpoint starts at zero."""
    layout = ParallelLayout()
    shapes = model_shapes(hf_config, layout.tp)
    weights = HFWeights(model_dir)
    params = dict(model.named_parameters())
    seen = set()
    for name, hf_names, kind in _local_rules(hf_config, layout, value_head):
        if name not in params:
            continue
        if value_head and hf_names[0].startswith("score.") and hf_names[0] not in weights:
            params[name].zero_()
        else:
            hf = [weights.get(h) for h in hf_names]
            local = shard(kind, hf, layout.tp_rank, layout.tp, shapes)
            if tuple(local.shape) != tuple(params[name].shape):
                raise ValueError(f"{model_dir}: {hf_names} gives {tuple(local.shape)} for {name}, expected "
                                 f"{tuple(params[name].shape)} (does config.json match the weights?)")
            params[name].copy_(local.to(params[name].dtype))
        # megatron tags split parameters only when it initialises them itself; the engine's gradient norm
        # counts replicated ones on tensor rank 0 only, so tag every parameter from its cut
        params[name].tensor_model_parallel = kind != "rep" and layout.tp > 1
        seen.add(name)
    missing = [n for n in params if n not in seen]
    if missing:
        raise ValueError(f"the HF->Megatron map has no source for {missing}")


def _broadcast_from(tensor: torch.Tensor | None, src_stage: int, layout: ParallelLayout, dtype) -> torch.Tensor:
    """Send a stage's tensor to every stage of this pipeline (shape first, then data)."""
    if layout.pp == 1:
        return tensor
    src = dist.get_global_rank(layout.pp_group, src_stage)
    dev = collective_device(layout.pp_group)
    header = torch.zeros(5, dtype=torch.int64, device=dev)
    if layout.pp_rank == src_stage:
        header[0] = tensor.dim()
        header[1 : 1 + tensor.dim()] = torch.tensor(tensor.shape)
    dist.broadcast(header, src=src, group=layout.pp_group)
    shape = tuple(int(x) for x in header[1 : 1 + int(header[0])])
    buf = tensor.contiguous() if layout.pp_rank == src_stage else torch.empty(shape, dtype=dtype, device=dev)
    dist.broadcast(buf, src=src, group=layout.pp_group)
    return buf


def _walk_stages(model: nn.Module, hf_config, layout: ParallelLayout, stats: dict, stage_tensors, *,
                 value_head: bool, tied_head: bool) -> Iterator[tuple[str, torch.Tensor]]:
    """Every weight of the model in HF order: the owning stage makes its tensors with ``stage_tensors(name, kind)``
    (one per HF name of the mcore parameter) and broadcasts them over the pipeline, counting received bytes in
    ``stats["recv_bytes"]``. ``tied_head``: a tied output layer is also sent, as ``lm_head.weight`` made from the
    embedding (``False``: not sent)."""
    arch = get_arch(hf_config)
    dtype = next(model.parameters()).dtype
    per_stage = hf_config.num_hidden_layers // layout.pp
    tied = bool(getattr(hf_config, "tie_word_embeddings", False)) and not value_head

    def emit(stage: int, name: str, hf_names: tuple, kind: str):
        tensors = stage_tensors(name, kind) if layout.pp_rank == stage else [None] * len(hf_names)
        for hf_name, t in zip(hf_names, tensors):
            out = _broadcast_from(t, stage, layout, dtype)
            if layout.pp_rank != stage:
                stats["recv_bytes"] += out.numel() * out.element_size()
            yield hf_name, out

    yield from emit(0, "embedding.word_embeddings.weight", ("model.embed_tokens.weight",), "vocab")
    for g in range(hf_config.num_hidden_layers):
        stage, local_index = divmod(g, per_stage)
        for rule in layer_rules(arch):
            yield from emit(stage, f"decoder.layers.{local_index}.{rule.mcore}",
                            tuple(f"model.layers.{g}.{h}" for h in rule.hf), rule.kind)
    last = layout.pp - 1
    yield from emit(last, "decoder.final_layernorm.weight", ("model.norm.weight",), "rep")
    if value_head:
        yield from emit(last, "output_layer.weight", ("score.weight",), "rep")
        yield from emit(last, "output_layer.bias", ("score.bias",), "rep")
    elif tied:
        if tied_head:
            yield from emit(0, "embedding.word_embeddings.weight", ("lm_head.weight",), "vocab")
    else:
        yield from emit(last, "output_layer.weight", ("lm_head.weight",), "vocab")


@torch.no_grad()
def iter_hf_params(model: nn.Module, hf_config, value_head: bool, stats: dict | None = None
                   ) -> Iterator[tuple[str, torch.Tensor]]:
    """Every weight under its HF name, full size, on every rank (collective: all ranks iterate together).

    Per parameter: the owning stage gathers the tensor-rank pieces and rebuilds the HF tensors, then
    broadcasts them over the pipeline. Tied causal LMs also yield ``lm_head.weight`` (rollout engines need it).
    ``stats["recv_bytes"]`` counts what this rank received from other ranks.
    """
    stats = stats if stats is not None else {}
    stats["recv_bytes"] = 0
    layout = ParallelLayout()
    shapes = model_shapes(hf_config, layout.tp)
    params = dict(model.named_parameters())

    def gathered(name: str, kind: str) -> list[torch.Tensor]:
        local = params[name].detach()
        if layout.tp == 1 or kind == "rep":
            return unshard(kind, [local], shapes)
        parts = [torch.empty_like(local) for _ in range(layout.tp)]
        dist.all_gather(parts, local.contiguous(), group=layout.tp_group)
        stats["recv_bytes"] += (layout.tp - 1) * local.numel() * local.element_size()
        return unshard(kind, parts, shapes)

    yield from _walk_stages(model, hf_config, layout, stats, gathered, value_head=value_head, tied_head=True)


@torch.no_grad()
def iter_hf_tp_shards(model: nn.Module, hf_config, vocab_range: tuple[int, int],
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
    layout = ParallelLayout()
    shapes = model_shapes(hf_config, layout.tp)
    params = dict(model.named_parameters())
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

    def own_pieces(name: str, kind: str) -> list[torch.Tensor]:
        local = params[name].detach()
        return [vocab_rows(local)] if kind == "vocab" else local_hf_pieces(kind, local, shapes, layout.tp)

    yield from _walk_stages(model, hf_config, layout, stats, own_pieces, value_head=False, tied_head=False)
