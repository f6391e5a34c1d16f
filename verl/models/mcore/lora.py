"""LoRA adapters on megatron-core's tensor-parallel linear layers, the experts' included
(``actor_rollout_ref.model.lora.*``, verl's keys for the Megatron path).

Each targeted layer (``linear_qkv``, ``linear_proj``, ``linear_fc1``, ``linear_fc2`` of the local layer spec) keeps
its frozen weight ``W`` and gains an ``adapter`` child holding ``lora_A`` (rank x in) and ``lora_B`` (out x rank);
the layer's output becomes ``W x + (alpha / rank) * B A x`` (a forward hook adds the second term, so no parameter
of the base model is renamed and the HF weight map, checkpoints and pipeline code see the same names as without
LoRA). The adapters split like their layer:

* column-parallel layers (``linear_qkv``, ``linear_fc1``: output rows cut over tensor ranks): ``B`` is cut by rows
  as ``W`` is, ``A`` is whole on every rank. Each rank's ``A`` gradient is its own rows' share, summed over the
  tensor ranks by the engine (``sum_grad_over_tp``), and the input enters the adapter through the same collective
  as the layer's own (copy to the tensor region, or the sequence-parallel all-gather).
* row-parallel layers (``linear_proj``, ``linear_fc2``: input columns cut): ``A`` is cut by columns as ``W`` is,
  ``A x`` is summed over the tensor ranks, ``B`` is whole on every rank (with sequence parallel the result is cut
  to the rank's slice of the sequence, as the layer's reduce-scatter cuts its output).

Initial values do not depend on the parallel layout: the full ``A`` / ``B`` of a layer come from a generator
seeded by the run's seed and the layer's global name, then each rank keeps its piece (``lora_A_init_method``:
``xavier`` = Xavier uniform, ``kaiming`` = Kaiming uniform with a = sqrt(5), as Megatron-Bridge; ``lora_B_init_method``
``zero`` by default, so the LoRA model starts as the base model). ``dropout`` applies to the adapter's input
(``dropout_position=pre``) or output (``post``): on activations every tensor rank holds whole with the default
generator (the same on every tensor rank, as megatron's hidden dropout), on split ones with megatron's
tensor-parallel generator.

Mixture-of-experts models (megatron-core's ``SequentialMLP``: one ``MLP`` per local expert, which is what the
engine's local layer spec builds): ``linear_fc1`` / ``linear_fc2`` name every routed expert's layers as well as a
dense MLP's and a shared expert's, so verl's default ``target_modules`` adapts them all. Each routed expert gets its
own ``lora_A`` / ``lora_B`` pair, matched and seeded under its *global* name
``decoder.layers.<layer>.mlp.experts.local_experts.<global expert>.<layer name>`` (an expert-parallel rank builds
adapters only for the experts it holds; the initial values do not depend on the expert-parallel size). Expert
adapters are ``is_expert`` parameters: their gradients are summed over the expert data-parallel group as the
experts' own. Under expert tensor parallelism (ETP > 1) an expert's layers do no communication of their own (the
token dispatcher all-gathers their input over the expert tensor group and reduce-scatters their output), so the
adapters do none in forward either: ``fc1``'s ``B`` is cut by rows (gate block and up block, as the weight) with
``A`` whole, ``fc2``'s ``A`` by columns with ``B`` whole (its partial products are summed by the dispatcher with
the layer's); the whole matrix's gradient is each rank's share, summed over the expert tensor group in backward.
Adapter dropout on the experts uses megatron's expert-parallel generator and is refused with ETP > 1 (the whole
activations there would need one mask on every expert tensor rank). The router, the shared expert's gate and a
grouped-GEMM expert layer (stacked expert weights) get no adapters; a target that would adapt a grouped one is
refused.

:func:`merged_weight` gives a rank's piece of ``W + scale * B @ A`` for an adapted weight (the merge is per row /
column block), which the HF weight export gathers and converts as it does any weight (an expert's over the expert
tensor group, then from its expert-parallel rank); :func:`adapters_disabled` runs the base model (the reference
policy). A gated ``linear_fc1``'s ``lora_B`` is checkpointed as megatron checkpoints the weight (gate and up halves
as separate global blocks), so a checkpoint loads at any tensor / expert layout, the model merger's included.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fnmatch
import json
import math
import os
import zlib
from collections.abc import Mapping

import torch
from torch import nn

from verl.models.mcore import get_arch
from verl.models.mcore.convert import num_experts

__all__ = ["LORA_TARGETS", "LORA_FILE", "LoraSettings", "lora_settings", "check_lora_settings", "adapts_experts",
           "apply_lora", "weight_adapters", "merged_weight", "adapters_disabled", "lora_adapters", "save_lora_settings",
           "load_lora_settings"]

COLUMN = ("linear_qkv", "linear_fc1")
ROW = ("linear_proj", "linear_fc2")
LORA_TARGETS = COLUMN + ROW
# Megatron-Bridge's canonical LoRA (separate q / k / v and gate / up adapters): not built here
CANONICAL = ("linear_q", "linear_k", "linear_v", "linear_fc1_up", "linear_fc1_gate")
A_INITS = ("xavier", "kaiming")
B_INITS = ("zero", "xavier", "kaiming")
# written beside a checkpoint's dist_ckpt/ so the model merger rebuilds the adapters before it reads the weights
LORA_FILE = "megatron_lora.json"


@dataclasses.dataclass(frozen=True)
class LoraSettings:
    """The ``model.lora`` keys the adapters are built from (see :func:`lora_settings`)."""

    rank: int
    alpha: float = 32.0
    dropout: float = 0.0
    dropout_position: str = "pre"
    target_modules: tuple = LORA_TARGETS
    exclude_modules: tuple = ()
    lora_A_init_method: str = "xavier"
    lora_B_init_method: str = "zero"
    dtype: str | None = None

    @property
    def scale(self) -> float:
        return float(self.alpha) / float(self.rank)

    def wants(self, global_name: str) -> bool:
        """Whether the linear layer ``global_name`` (``decoder.layers.<global index>.<path>``) gets an adapter:
        Megatron-Bridge's matching (a name without ``*`` matches the layer's last name, one with ``*`` the whole
        name; ``exclude_modules`` means every LoRA-capable layer except those)."""
        leaf = global_name.rsplit(".", 1)[-1]
        if leaf not in LORA_TARGETS:
            return False

        def matches(patterns) -> bool:
            return any(fnmatch.fnmatchcase(global_name, p) if "*" in p else leaf == p for p in patterns)

        if self.exclude_modules:
            return not matches(self.exclude_modules)
        return matches(self.target_modules)


def _plain_list(value) -> tuple:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    return tuple(str(v) for v in value)


def lora_settings(cfg) -> LoraSettings | None:
    """``model.lora`` (a mapping or typed section) as :class:`LoraSettings`; None when ``rank`` is 0 (no LoRA)."""
    if cfg is None:
        return None
    get = cfg.get if hasattr(cfg, "get") else (lambda k, d=None: getattr(cfg, k, d))
    rank = int(get("rank", 0) or 0)
    if rank <= 0:
        return None
    targets = get("target_modules", None)
    return LoraSettings(rank=rank, alpha=float(get("alpha", 32)), dropout=float(get("dropout", 0.0) or 0.0),
                        dropout_position=str(get("dropout_position", "pre")),
                        target_modules=_plain_list(LORA_TARGETS if targets is None else targets),
                        exclude_modules=_plain_list(get("exclude_modules", None)),
                        lora_A_init_method=str(get("lora_A_init_method", "xavier")),
                        lora_B_init_method=str(get("lora_B_init_method", "zero")),
                        dtype=None if get("dtype", None) is None else str(get("dtype")))


def check_lora_settings(cfg, hf_config, prefix: str, dtypes: Mapping | None = None,
                        megatron: Mapping | None = None) -> LoraSettings | None:
    """Refuse, naming ``<prefix>.<key>``, the ``model.lora`` values the Megatron engine cannot build (call before
    any worker starts); returns the settings (None without LoRA). ``megatron``: the role's ``megatron`` section
    (its expert tensor-parallel size decides whether dropout on the experts' adapters is built)."""
    s = lora_settings(cfg)
    if s is None:
        return None
    get = cfg.get if hasattr(cfg, "get") else (lambda k, d=None: getattr(cfg, k, d))
    kind = str(get("type", "lora") or "lora")
    if kind != "lora":
        raise ValueError(f"{prefix}.type={kind!r} is not available: the Megatron engine builds plain LoRA on the fused "
                         "layers (linear_qkv, linear_proj, linear_fc1, linear_fc2: dense MLPs, shared and routed "
                         "experts); canonical_lora, dora and vlm_lora are Megatron-Bridge modules not built here; use "
                         "type=lora")
    if s.target_modules and s.exclude_modules:
        raise ValueError(f"{prefix}.exclude_modules={list(s.exclude_modules)} with target_modules="
                         f"{list(s.target_modules)}: set one of them (exclude_modules adapts every other LoRA layer; "
                         "set target_modules=[] to use it)")
    for key, names in (("target_modules", s.target_modules), ("exclude_modules", s.exclude_modules)):
        for name in names:
            if "*" in name:
                continue
            if name in CANONICAL:
                raise ValueError(f"{prefix}.{key} names {name!r}, a canonical-LoRA layer (separate q/k/v, gate/up "
                                 f"adapters) that is not built here; use the fused layers {list(LORA_TARGETS)}")
            if name in UNADAPTED:
                raise ValueError(f"{prefix}.{key} names {name!r}: {UNADAPTED[name]}; use some of "
                                 f"{list(LORA_TARGETS)} (linear_fc1 / linear_fc2 adapt every expert's MLP)")
            if name not in LORA_TARGETS:
                raise ValueError(f"{prefix}.{key} names {name!r}, which is not a LoRA layer of the Megatron engine; "
                                 f"use some of {list(LORA_TARGETS)} (or a wildcard such as "
                                 "'*.layers.0.*.linear_qkv')")
    if s.dropout_position not in ("pre", "post"):
        raise ValueError(f"{prefix}.dropout_position={s.dropout_position!r} is not one of pre, post")
    if not 0.0 <= s.dropout < 1.0:
        raise ValueError(f"{prefix}.dropout={s.dropout!r} must be a number in [0, 1)")
    if s.lora_A_init_method not in A_INITS:
        raise ValueError(f"{prefix}.lora_A_init_method={s.lora_A_init_method!r} is not one of {', '.join(A_INITS)}")
    if s.lora_B_init_method not in B_INITS:
        raise ValueError(f"{prefix}.lora_B_init_method={s.lora_B_init_method!r} is not one of {', '.join(B_INITS)}")
    if s.dtype is not None and dtypes is not None and s.dtype not in dtypes:
        raise ValueError(f"{prefix}.dtype={s.dtype!r} is not one of {sorted(dtypes)} (or null: the model's dtype)")
    if hf_config is not None and megatron is not None and s.dropout > 0 and adapts_experts(s, hf_config):
        meg = dict(megatron.items()) if hasattr(megatron, "items") else dict(megatron)
        tp = int(meg.get("tensor_model_parallel_size") or 1)
        etp = int(meg.get("expert_tensor_parallel_size") or tp)
        if etp > 1:
            raise ValueError(expert_dropout_refusal(prefix, s.dropout, etp))
    return s


# verl names that are no LoRA layer here: what they are, and why they get no adapter
UNADAPTED = {"router": "the mixture-of-experts router stays frozen (it gets no adapter)"}


def adapts_experts(s: LoraSettings, hf_config) -> bool:
    """Whether ``s`` puts adapters on any routed expert of ``hf_config`` (False for a dense model)."""
    arch = get_arch(hf_config)
    if not arch.experts:
        return False
    return any(arch.is_moe_layer(hf_config, i) and s.wants(f"decoder.layers.{i}.mlp.experts.local_experts.{e}.{t}")
               for i in range(int(hf_config.num_hidden_layers)) for e in range(num_experts(hf_config))
               for t in ("linear_fc1", "linear_fc2"))


def expert_dropout_refusal(prefix: str, dropout: float, etp: int) -> str:
    return (f"{prefix}.dropout={dropout} with megatron.expert_tensor_parallel_size={etp}: dropout on the experts' "
            "adapters is built for expert_tensor_parallel_size=1 only (with ETP > 1 each expert's input and partial "
            "output are whole on every expert tensor rank and would need one mask there); set dropout=0, "
            "expert_tensor_parallel_size=1, or leave the routed experts out (e.g. target_modules=[] with "
            "exclude_modules=['*.experts.*'])")


# ------------------------------------------------------------------------------------------------- adapters

def _seed_for(seed: int, global_name: str, which: str) -> int:
    return (int(seed) * 1_000_003 + zlib.crc32(f"{global_name}.{which}".encode())) % (2**63 - 1)


def _init_full(shape: tuple[int, int], method: str, seed: int) -> torch.Tensor:
    """A full (layout-independent) adapter matrix in fp32: ``shape`` = (out, in) as nn.Linear stores it."""
    out = torch.zeros(shape, dtype=torch.float32)
    if method == "zero":
        return out
    fan_out, fan_in = shape
    if method == "xavier":
        bound = math.sqrt(6.0 / (fan_in + fan_out))
    else:  # kaiming uniform with a = sqrt(5) (torch's nn.Linear default): bound 1 / sqrt(fan_in)
        bound = 1.0 / math.sqrt(fan_in)
    gen = torch.Generator().manual_seed(seed)
    return out.uniform_(-bound, bound, generator=gen)


def _local_rows(leaf: str, full_rows: int, tp: int, rank: int, gated: bool) -> torch.Tensor:
    """Row indices of a column-parallel layer's full (TP=1) output held by tensor rank ``rank``: a contiguous block,
    except a gated ``linear_fc1`` whose rank holds its block of the gate rows and of the up rows."""
    if leaf == "linear_fc1" and gated:
        half = full_rows // 2
        block = torch.arange(rank * half // tp, (rank + 1) * half // tp)
        return torch.cat([block, block + half])
    per = full_rows // tp
    return torch.arange(rank * per, (rank + 1) * per)


class LoRAAdapter(nn.Module):
    """``lora_A`` / ``lora_B`` of one tensor-parallel linear layer (this rank's pieces; see the module docstring).
    ``expert``: the layer is a routed expert's (``tp`` / ``tp_rank`` / ``group``: the expert tensor-parallel ones)."""

    def __init__(self, base: nn.Module, leaf: str, global_name: str, s: LoraSettings, seed: int, tp: int,
                 tp_rank: int, dtype: torch.dtype, gated: bool, expert: bool = False, group=None):
        super().__init__()
        self.column = leaf in COLUMN
        self.gated_fc1 = leaf == "linear_fc1" and gated
        self.scale = s.scale
        self.dropout = float(s.dropout)
        self.dropout_position = s.dropout_position
        self.enabled = True
        self.expert = bool(expert)
        # an expert's layers communicate nothing themselves (the token dispatcher does), nor does its adapter
        self.sequence_parallel = bool(getattr(base, "sequence_parallel", False)) and not self.expert
        self.tp = tp
        # experts under expert tensor parallelism: the whole matrix's gradient (fc1's A, fc2's B) is each rank's
        # share, summed over this group in backward
        self.grad_group = group if self.expert and tp > 1 else None
        weight = base.weight
        device = weight.device
        out_local, in_local = weight.shape
        out_full = out_local * tp if self.column else out_local
        in_full = in_local if self.column else in_local * tp
        a_full = _init_full((s.rank, in_full), s.lora_A_init_method, _seed_for(seed, global_name, "lora_A"))
        b_full = _init_full((out_full, s.rank), s.lora_B_init_method, _seed_for(seed, global_name, "lora_B"))
        if self.column:
            a = a_full
            b = b_full[_local_rows(leaf, out_full, tp, tp_rank, gated)]
        else:
            a = a_full[:, tp_rank * in_local:(tp_rank + 1) * in_local]
            b = b_full
        self.lora_A = nn.Parameter(a.to(device=device, dtype=dtype).contiguous())
        self.lora_B = nn.Parameter(b.to(device=device, dtype=dtype).contiguous())
        split = tp > 1
        # the engine's gradient reduction and norm read these: a split piece is counted on every tensor rank; a whole
        # matrix once, and the column layers' A sums its per-rank gradient shares over the tensor ranks (an expert's
        # whole matrix sums them itself, over the expert tensor group)
        self.lora_A.tensor_model_parallel = split and not self.column
        self.lora_B.tensor_model_parallel = split and self.column
        self.lora_A.sum_grad_over_tp = split and self.column and not self.expert
        # an expert's adapters: gradients summed over the expert data-parallel group, norm over the expert grid
        self.lora_A.is_expert = self.lora_B.is_expert = self.expert

    def _drop(self, x: torch.Tensor, split: bool) -> torch.Tensor:
        """Dropout on ``x``: with megatron's tensor-parallel generator when ``x`` is this rank's own piece, with the
        default generator (equal on the tensor ranks) when every tensor rank holds the same values; an expert's with
        megatron's expert-parallel generator (its tokens are its expert-parallel rank's own; expert tensor
        parallelism with dropout is refused)."""
        if not self.training or self.dropout == 0.0:
            return x
        if self.expert or (split and self.tp > 1):
            # optional heavy dependency: megatron-core (~10 s to import) is needed only with strategy=megatron
            from megatron.core.tensor_parallel import get_cuda_rng_tracker, get_expert_parallel_rng_tracker_name

            fork = get_cuda_rng_tracker().fork(get_expert_parallel_rng_tracker_name()) if self.expert else \
                get_cuda_rng_tracker().fork()
            with fork:
                return nn.functional.dropout(x, self.dropout, True)
        return nn.functional.dropout(x, self.dropout, True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The adapter's term of the layer output, laid out as the layer's output on this rank."""
        # optional heavy dependency: megatron-core (~10 s to import) is needed only with strategy=megatron
        from megatron.core import tensor_parallel as mtp

        dtype = x.dtype
        x = x.to(self.lora_A.dtype)
        if self.expert:
            return self._expert_forward(x).to(dtype)
        if self.column:
            if self.tp > 1:  # the layer's own input collective: its backward sums the ranks' input-gradient shares
                x = (mtp.gather_from_sequence_parallel_region(x) if self.sequence_parallel
                     else mtp.copy_to_tensor_model_parallel_region(x))
            if self.dropout_position == "pre":
                x = self._drop(x, split=False)
            y = nn.functional.linear(nn.functional.linear(x, self.lora_A), self.lora_B) * self.scale
            if self.dropout_position == "post":
                y = self._drop(y, split=True)
            return y.to(dtype)
        if self.dropout_position == "pre":
            x = self._drop(x, split=True)
        h = nn.functional.linear(x, self.lora_A)
        if self.tp > 1:
            h = mtp.reduce_from_tensor_model_parallel_region(h)
        y = nn.functional.linear(h, self.lora_B) * self.scale
        if self.tp > 1 and self.sequence_parallel:
            y = mtp.scatter_to_sequence_parallel_region(y)
        if self.dropout_position == "post":
            y = self._drop(y, split=self.tp > 1 and self.sequence_parallel)
        return y.to(dtype)

    def _expert_forward(self, x: torch.Tensor) -> torch.Tensor:
        """A routed expert's adapter term: no collective in forward (fc1's input is whole on every expert tensor rank,
        fc2's partial output is summed with the layer's by the dispatcher); with ETP > 1 the whole matrix's
        gradient shares are summed over the expert tensor group."""
        a, b = self.lora_A, self.lora_B
        if self.grad_group is not None:
            # optional heavy dependency: megatron-core (~10 s to import) is needed only with strategy=megatron
            from megatron.core.tensor_parallel import copy_to_tensor_model_parallel_region

            if self.column:
                a = copy_to_tensor_model_parallel_region(a, group=self.grad_group)
            else:
                b = copy_to_tensor_model_parallel_region(b, group=self.grad_group)
        if self.dropout_position == "pre":
            x = self._drop(x, split=not self.column)
        y = nn.functional.linear(nn.functional.linear(x, a), b) * self.scale
        if self.dropout_position == "post":
            y = self._drop(y, split=self.column)
        return y

    @torch.no_grad()
    def merged(self, weight: torch.Tensor) -> torch.Tensor:
        """This rank's piece of ``W + scale * B @ A`` (fp32 arithmetic, in ``weight``'s dtype)."""
        delta = self.lora_B.detach().float() @ self.lora_A.detach().float()
        return (weight.detach().float() + self.scale * delta).to(weight.dtype)


def _output_hook(module, args, kwargs, output):
    adapter = module.adapter
    if not adapter.enabled:
        return output
    x = args[0] if args else kwargs["input_"]
    out, bias = output
    return out + adapter(x), bias


def _sharded_state_dict_with_adapter(base: nn.Module, original):
    """The base layer's ``sharded_state_dict`` with its adapter's tensors sharded as they are split (megatron's own
    treats every tensor it does not know as replicated over the tensor ranks)."""

    def sharded_state_dict(prefix: str = "", sharded_offsets=(), metadata=None):
        # optional heavy dependency: megatron-core (~10 s to import) is needed only with strategy=megatron
        from megatron.core.transformer.mlp import apply_swiglu_sharded_factory
        from megatron.core.transformer.utils import ensure_metadata_has_dp_cp_group, make_sharded_tensors_for_checkpoint

        metadata = ensure_metadata_has_dp_cp_group(metadata)
        out = original(prefix=prefix, sharded_offsets=sharded_offsets, metadata=metadata)
        adapter = base.adapter
        axes = {"lora_B": 0} if adapter.column else {"lora_A": 1}
        adapter_sd = make_sharded_tensors_for_checkpoint(
            adapter.state_dict(prefix="", keep_vars=True), f"{prefix}adapter.", axes, sharded_offsets,
            tp_group=getattr(base, "tp_group", None), dp_cp_group=metadata["dp_cp_group"])
        if adapter.gated_fc1:  # this rank's rows are its gate block and its up block: saved as megatron saves W
            key = f"{prefix}adapter.lora_B"
            adapter_sd[key] = apply_swiglu_sharded_factory(adapter_sd[key], sharded_offsets,
                                                           bool(metadata.get("singleton_local_shards", False)))
        out.update(adapter_sd)
        return out

    return sharded_state_dict


def apply_lora(chunks, hf_config, s: LoraSettings, seed: int, dtype: torch.dtype | None = None) -> int:
    """Freeze every parameter of this rank's model chunks and add adapters to the layers ``s`` targets (global layer
    numbers, and global expert numbers for routed experts, in the names ``s`` matches). Returns how many layers were
    adapted on this rank."""
    # optional heavy dependency: megatron-core (~10 s to import) is needed only with strategy=megatron
    from verl.models.mcore.model import ParallelLayout, as_chunks

    chunks = as_chunks(chunks)
    layout = ParallelLayout(len(chunks))
    arch = get_arch(hf_config)
    n_local = num_experts(hf_config) // layout.ep if arch.experts else 0
    count = 0
    for v, chunk in enumerate(chunks):
        chunk.requires_grad_(False)
        offset = layout.chunk_offset(hf_config.num_hidden_layers, v)
        for name, module in list(chunk.named_modules()):
            if not name.startswith("decoder.layers.") or name.count(".") < 3:
                continue
            local, rest = name[len("decoder.layers."):].split(".", 1)
            layer = offset + int(local)
            if rest == "mlp.experts" and not hasattr(module, "local_experts"):
                _refuse_grouped_experts(s, hf_config, layer, type(module).__name__)
            leaf = name.rsplit(".", 1)[-1]
            if leaf not in LORA_TARGETS:
                continue
            expert = rest.startswith("mlp.experts.local_experts.")
            if expert:  # named by its global expert index: expert-parallel rank r holds r * n_local ...
                local_expert = int(rest.split(".")[3])
                rest = f"mlp.experts.local_experts.{layout.ep_rank * n_local + local_expert}.{leaf}"
            global_name = f"decoder.layers.{layer}.{rest}"
            if not s.wants(global_name):
                continue
            if expert and layout.etp > 1 and s.dropout > 0:
                raise ValueError(expert_dropout_refusal("model.lora", s.dropout, layout.etp))
            adapter_dtype = dtype if dtype is not None else module.weight.dtype
            gated = bool(getattr(getattr(module, "config", None), "gated_linear_unit", True))
            tp, tp_rank, group = (layout.etp, layout.etp_rank, layout.etp_group) if expert else \
                (layout.tp, layout.tp_rank, layout.tp_group)
            module.adapter = LoRAAdapter(module, leaf, global_name, s, seed, tp, tp_rank, adapter_dtype, gated,
                                         expert=expert, group=group)
            module.register_forward_hook(_output_hook, with_kwargs=True)
            module.sharded_state_dict = _sharded_state_dict_with_adapter(module, module.sharded_state_dict)
            count += 1
    return count


def _refuse_grouped_experts(s: LoraSettings, hf_config, layer: int, cls: str) -> None:
    """An expert layer with stacked weights (grouped GEMM) has no per-expert linear layers to adapt."""
    wanted = [t for t in ("linear_fc1", "linear_fc2")
              if any(s.wants(f"decoder.layers.{layer}.mlp.experts.local_experts.{e}.{t}")
                     for e in range(num_experts(hf_config)))]
    if wanted:
        raise ValueError(f"model.lora.target_modules adapts the experts' {wanted}, but layer {layer}'s experts are a "
                         f"{cls} (grouped GEMM, stacked expert weights), which gets no adapters here; LoRA on the "
                         "experts is built for megatron-core's SequentialMLP (the engine's default: "
                         "override_transformer_config.moe_grouped_gemm=False), or leave the routed experts out "
                         "(target_modules=[] with exclude_modules=['*.experts.*'])")


def lora_adapters(chunks) -> list[LoRAAdapter]:
    return [m for c in (chunks if isinstance(chunks, (list, tuple, nn.ModuleList)) else [chunks])
            for m in c.modules() if isinstance(m, LoRAAdapter)]


@contextlib.contextmanager
def adapters_disabled(chunks):
    """Within the block the model computes without its adapters (the base model: LoRA's reference policy)."""
    adapters = lora_adapters(chunks)
    before = [a.enabled for a in adapters]
    for a in adapters:
        a.enabled = False
    try:
        yield
    finally:
        for a, was in zip(adapters, before):
            a.enabled = was


def weight_adapters(chunk: nn.Module) -> dict:
    """The adapters of a model chunk by the name of the weight they adapt (``...linear_qkv.weight``)."""
    return {f"{name}.weight": m.adapter for name, m in chunk.named_modules()
            if isinstance(getattr(m, "adapter", None), LoRAAdapter)}


def merged_weight(adapters: dict, name: str, weight: torch.Tensor) -> torch.Tensor:
    """``weight`` (the parameter ``name`` of a chunk whose :func:`weight_adapters` are ``adapters``) with its
    adapter merged in, ``W + scale * B @ A`` (this rank's piece); unchanged without an enabled adapter."""
    adapter = adapters.get(name)
    return adapter.merged(weight) if adapter is not None and adapter.enabled else weight


def save_lora_settings(s: LoraSettings, directory: str) -> None:
    with open(os.path.join(directory, LORA_FILE), "w") as f:
        json.dump(dataclasses.asdict(s), f, indent=1)


def load_lora_settings(directory: str) -> LoraSettings | None:
    path = os.path.join(directory, LORA_FILE)
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        data = json.load(f)
    for k in ("target_modules", "exclude_modules"):
        data[k] = tuple(data.get(k) or ())
    return LoraSettings(**data)
