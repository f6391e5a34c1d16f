"""FSDP2 training-engine helpers: sharding, LoRA, optimizer / scheduler, grad clipping, full-weight streaming.

Only FSDP2 (``torch.distributed.fsdp.fully_shard``) is supported: FSDP1's full-state-dict gather with CPU
offload segfaults on CPU builds, and FSDP2 gives per-parameter DTensors that make the rest simple.

Typical worker-side order (what ``fsdp_workers.py`` does)::

    model = load_causal_lm(path, dtype=fsdp_config.model_dtype)
    if model_cfg.lora_rank > 0: model = apply_lora(model, model_cfg.lora_rank, model_cfg.lora_alpha, model_cfg.target_modules)
    if model_cfg.enable_gradient_checkpointing: enable_gradient_checkpointing(model)
    model = apply_fsdp2(model, fsdp_config, create_device_mesh(world_size, fsdp_config.fsdp_size))
    optimizer = build_optimizer(model.parameters(), actor_cfg.optim)
    lr_scheduler = build_lr_scheduler(optimizer, actor_cfg.optim, total_steps)
    ...
    for name, tensor in iter_full_state_dict(model):   # hybrid engine: HF names, one full tensor at a time
        ...
"""

from __future__ import annotations

import importlib
import inspect
import math
import os
from collections.abc import Iterable, Iterator, Mapping

import torch
import torch.distributed as dist
from torch import nn
from transformers.optimization import (get_constant_schedule_with_warmup,
                                       get_cosine_with_min_lr_schedule_with_warmup)

from verl.utils.device import get_device_name, get_torch_device
from verl.utils.model import to_torch_dtype, unwrap_peft

from omegaconf import DictConfig, ListConfig, OmegaConf
from peft import LoraConfig, PeftModel, TaskType, get_peft_model
from peft.tuners.lora import LoraLayer
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor, distribute_tensor

__all__ = [
    "gathered_bytes",
    "create_device_mesh",
    "get_fsdp_wrap_modules",
    "get_mixed_precision_policy",
    "load_lora_adapter",
    "apply_fsdp2",
    "fsdp_version",
    "enable_gradient_checkpointing",
    "apply_lora",
    "is_peft_model",
    "build_optimizer",
    "build_lr_scheduler",
    "clip_grad_norm_",
    "iter_full_state_dict",
    "get_full_state_dict",
    "load_full_state_dict",
    "offload_fsdp_model_to_cpu",
    "load_fsdp_model_to_gpu",
    "offload_fsdp_optimizer",
    "load_fsdp_optimizer",
]



# ------------------------------------------------------------------------------------------------ sharding
def create_device_mesh(world_size: int | None = None, fsdp_size: int = -1):
    """1-D mesh ``("fsdp",)`` over all ranks, or a 2-D HSDP mesh ``("ddp", "fsdp")`` when 0 < fsdp_size < world."""
    world_size = world_size or dist.get_world_size()
    device = get_device_name()
    if fsdp_size is None or fsdp_size <= 0 or fsdp_size >= world_size:
        return init_device_mesh(device, (world_size,), mesh_dim_names=("fsdp",))
    if world_size % fsdp_size != 0:
        raise ValueError(f"fsdp_config.fsdp_size={fsdp_size} must divide the world size {world_size} (or be -1)")
    return init_device_mesh(device, (world_size // fsdp_size, fsdp_size), mesh_dim_names=("ddp", "fsdp"))


def _as_mesh(mesh_or_group):
    if mesh_or_group is None:
        return create_device_mesh()
    if isinstance(mesh_or_group, DeviceMesh):
        return mesh_or_group
    return DeviceMesh.from_group(mesh_or_group, get_device_name())


def get_fsdp_wrap_modules(model: nn.Module, layer_cls_names=None) -> list[nn.Module]:
    """The decoder layers: modules whose class is named in ``layer_cls_names`` or in the HF model's
    ``_no_split_modules``, else ``model.model.layers``."""
    base = unwrap_peft(model)
    if isinstance(layer_cls_names, str):
        layer_cls_names = [layer_cls_names]
    names = set(layer_cls_names or getattr(base, "_no_split_modules", None) or [])
    found = [m for m in model.modules() if type(m).__name__ in names] if names else []
    if found:
        return found
    layers = getattr(getattr(base, "model", None), "layers", None)
    return list(layers) if layers is not None else []


def get_mixed_precision_policy(fsdp_config, model: nn.Module | None = None) -> MixedPrecisionPolicy:
    """``fsdp_config.mixed_precision.{param_dtype, reduce_dtype}``, else ``fsdp_config.dtype`` as the compute dtype
    with fp32 gradient reduction; ``fsdp_config`` None computes in the stored dtype. A compute dtype equal to the
    stored parameter dtype means no cast."""
    param_dtype = reduce_dtype = None
    if fsdp_config is not None:
        mp = fsdp_config.mixed_precision
        param_dtype, reduce_dtype = mp.param_dtype or fsdp_config.dtype, mp.reduce_dtype
    param_dtype = to_torch_dtype(param_dtype, None)
    reduce_dtype = to_torch_dtype(reduce_dtype, torch.float32)  # null: gradients reduced in fp32
    stored = None
    if model is not None:
        stored = next((p.dtype for p in model.parameters() if p.is_floating_point()), None)
    if param_dtype == stored:
        param_dtype = None  # compute in the stored dtype: no cast
    if param_dtype is None and reduce_dtype == stored:
        reduce_dtype = None
    return MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype, cast_forward_inputs=True)


def apply_fsdp2(model: nn.Module, fsdp_config=None, device_mesh=None) -> nn.Module:
    """Shard ``model`` in place with FSDP2: each decoder layer, then the root (embeddings, final norm, head).

    ``device_mesh``: a DeviceMesh (1-D, or 2-D ``("ddp", "fsdp")`` for HSDP), a ProcessGroup, or None (all ranks).
    ``fsdp_config``: the role's typed ``fsdp_config`` section (``verl.workers.config.FSDPEngineConfig``), whose
    ``dtype`` / ``mixed_precision.{param_dtype, reduce_dtype, buffer_dtype}``, ``reshard_after_forward``,
    ``forward_prefetch`` (each layer prefetches the next one's all-gather), ``offload_policy`` (``CPUOffloadPolicy``
    on accelerators; on CPU the parameters already live in host memory, so it is accepted and does nothing) and
    ``wrap_policy.transformer_layer_cls_to_wrap`` (layer class names; null: the model's ``_no_split_modules``) are
    read. None shards with ``fully_shard``'s own settings in the stored dtype (gradients reduced in fp32).
    ``param_offload`` / ``optimizer_offload`` are the worker's business: it calls :func:`offload_fsdp_model_to_cpu`
    / :func:`offload_fsdp_optimizer` between phases (no-ops on CPU).
    """
    kwargs = dict(mesh=_as_mesh(device_mesh), mp_policy=get_mixed_precision_policy(fsdp_config, model))
    if fsdp_config is None:
        layers = get_fsdp_wrap_modules(model)
    else:
        kwargs["reshard_after_forward"] = bool(fsdp_config.reshard_after_forward)
        if fsdp_config.offload_policy and get_device_name() != "cpu":
            kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=True)
        buffer_dtype = to_torch_dtype(fsdp_config.mixed_precision.buffer_dtype, None)
        if buffer_dtype is not None:  # buffers are not sharded: each rank keeps them whole, in this dtype
            for buf in model.buffers():
                if buf.is_floating_point():
                    buf.data = buf.data.to(buffer_dtype)
        layers = get_fsdp_wrap_modules(model, fsdp_config.wrap_policy.transformer_layer_cls_to_wrap)
    for module in layers:
        fully_shard(module, **kwargs)
    fully_shard(model, **kwargs)
    if fsdp_config is not None and fsdp_config.forward_prefetch:
        # each layer's forward starts the next layer's all-gather as soon as its own is copied out
        for layer, nxt in zip(layers, layers[1:]):
            layer.set_modules_to_forward_prefetch([nxt])
    return model


def fsdp_version(model: nn.Module) -> int:
    """2 for an FSDP2-sharded module, 0 otherwise (FSDP1 is not supported here)."""
    return 2 if isinstance(model, FSDPModule) else 0


def enable_gradient_checkpointing(model: nn.Module) -> None:
    """Activation checkpointing of the decoder layers (non-reentrant, works with FSDP2 and LoRA)."""
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if is_peft_model(model) and hasattr(model, "enable_input_require_grads"):
        model.enable_input_require_grads()


# ------------------------------------------------------------------------------------------------ LoRA
def is_peft_model(model: nn.Module) -> bool:
    return isinstance(model, PeftModel)


def _to_plain(value):
    if isinstance(value, (DictConfig, ListConfig)):
        return OmegaConf.to_container(value, resolve=True)
    return value


def apply_lora(model: nn.Module, lora_rank: int, lora_alpha: float = 16, target_modules="all-linear",
               exclude_modules=None) -> nn.Module:
    """Wrap ``model`` with peft LoRA adapters (rank ``lora_rank``); only adapter weights stay trainable.

    A token-classification critic keeps its value head (``score``) trainable as well.
    """
    if lora_rank <= 0:
        raise ValueError(f"apply_lora needs lora_rank > 0, got {lora_rank}")
    is_token_cls = type(model).__name__.endswith("ForTokenClassification")
    exclude_modules = _to_plain(exclude_modules)
    if is_token_cls:  # the value head is trained in full (modules_to_save), not adapted
        exclude_modules = [exclude_modules] if isinstance(exclude_modules, str) else list(exclude_modules or [])
        exclude_modules.append("score")
    config = LoraConfig(
        task_type=TaskType.TOKEN_CLS if is_token_cls else TaskType.CAUSAL_LM,
        r=int(lora_rank),
        lora_alpha=lora_alpha,
        target_modules=_to_plain(target_modules),
        exclude_modules=exclude_modules,
        bias="none",
    )
    return get_peft_model(model, config)


def load_lora_adapter(model: nn.Module, path: str) -> nn.Module:
    """``model.lora_adapter_path``: the PEFT adapter saved at ``path`` on ``model``, trainable (only the adapter
    weights require grad, as with :func:`apply_lora`)."""
    return PeftModel.from_pretrained(model, os.path.expanduser(str(path)), is_trainable=True)


# ------------------------------------------------------------------------------------------------ optimizer
def build_optimizer(params: Iterable, optim_cfg, extra_kwargs: dict | None = None) -> torch.optim.Optimizer:
    """``optim_cfg.optimizer`` from ``optim_cfg.optimizer_impl`` with ``lr``, ``betas``, ``weight_decay`` (+ ``eps``)
    and any ``override_optimizer_config`` kwargs (``extra_kwargs`` in their place when given: the Megatron engine's,
    without megatron-core's own optimizer fields). ``optim_cfg`` is the role's typed ``optim`` section
    (``verl.workers.config.OptimizerConfig``: every key is read, its defaults are the schema's)."""
    impl, name = optim_cfg.optimizer_impl, optim_cfg.optimizer
    try:
        cls = getattr(importlib.import_module(impl), name)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"optim.optimizer={name!r} not found in optim.optimizer_impl={impl!r}") from err
    kwargs = {"lr": float(optim_cfg.lr), "weight_decay": float(optim_cfg.weight_decay)}
    if name.lower().startswith("adam"):
        kwargs["betas"] = tuple(float(b) for b in optim_cfg.betas)
        if optim_cfg.eps is not None:  # null: the optimizer's own epsilon
            kwargs["eps"] = float(optim_cfg.eps)
    if extra_kwargs is None:
        extra_kwargs = _to_plain(optim_cfg.override_optimizer_config) or {}
    kwargs.update(extra_kwargs)
    params = [p for p in params if p.requires_grad]
    if not params:
        raise ValueError("build_optimizer: no trainable parameters")
    if _wants_foreach(cls, kwargs, params):
        kwargs["foreach"] = True
    return cls(params, **kwargs)


def _wants_foreach(cls, kwargs: dict, params: list) -> bool:
    """True for FSDP2 (DTensor) parameters on CPU when the user chose no implementation: torch then picks its
    per-parameter loop, which pays DTensor dispatch once per tensor per op (4x the step time of the same loop
    on plain tensors for the tiny model); the ``foreach`` form computes the same update with one dispatch per
    op over the whole list. On accelerators torch already picks ``foreach`` for DTensors."""
    if "foreach" in kwargs or kwargs.get("fused") or "foreach" not in inspect.signature(cls).parameters:
        return False
    return any(isinstance(p, DTensor) and p.device.type == "cpu" for p in params)


def build_lr_scheduler(optimizer: torch.optim.Optimizer, optim_cfg, total_steps: int | None = None):
    """Warm-up then constant or cosine (``lr_scheduler_type``, or the older ``warmup_style``): transformers'
    ``get_constant_schedule_with_warmup`` / ``get_cosine_with_min_lr_schedule_with_warmup``. ``optim_cfg`` is the
    role's typed ``optim`` section (``verl.workers.config.OptimizerConfig``).

    Warm-up steps: ``lr_warmup_steps`` when > 0, else ``lr_warmup_steps_ratio * total_steps``. ``total_steps``
    defaults to ``optim.total_training_steps``. Cosine decays to ``min_lr_ratio * lr`` over ``num_cycles``.
    """
    total = total_steps if total_steps and total_steps > 0 else int(optim_cfg.total_training_steps)
    warmup = int(optim_cfg.lr_warmup_steps)
    if warmup <= 0:
        warmup = int(float(optim_cfg.lr_warmup_steps_ratio) * max(total, 0))
    style = optim_cfg.warmup_style or optim_cfg.lr_scheduler_type
    if style == "constant":
        return get_constant_schedule_with_warmup(optimizer, num_warmup_steps=warmup)
    if style == "cosine":
        if total <= 0:
            raise ValueError("lr_scheduler_type=cosine needs the total number of training steps "
                             "(optim.total_training_steps or the total_steps argument)")
        return get_cosine_with_min_lr_schedule_with_warmup(
            optimizer, num_warmup_steps=warmup, num_training_steps=total,
            num_cycles=float(optim_cfg.num_cycles),
            min_lr_rate=float(optim_cfg.min_lr_ratio or 0.0),  # null: no floor
        )
    raise ValueError(f"optim.lr_scheduler_type={style!r} is not supported; use constant or cosine")


def clip_grad_norm_(parameters: Iterable[torch.Tensor], max_norm: float | None, norm_type: float = 2.0) -> float:
    """Global gradient norm over (DTensor or plain) gradients, clipped to ``max_norm`` when it is finite.

    Returns the pre-clip norm as a float. A non-finite norm leaves the gradients untouched: the caller should
    skip ``optimizer.step()`` (and zero the gradients), as the actor and critic do.
    """
    params = [p for p in parameters if p.grad is not None]
    if not params:
        return 0.0
    total = torch.nn.utils.get_total_norm([p.grad for p in params], norm_type=norm_type)
    if isinstance(total, DTensor):
        total = total.full_tensor()
    norm = float(total.item())
    if max_norm is not None and max_norm > 0 and math.isfinite(norm):
        coef = float(max_norm) / (norm + 1e-6)
        if coef < 1.0:
            for p in params:
                p.grad.mul_(coef)
    return norm


# ------------------------------------------------------------------------------------------------ full weights
_PEFT_PREFIX = "base_model.model."


def _full(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor behind ``t``. A DTensor whose local piece already is the whole tensor (a mesh of one
    rank, or replicated placements) is returned as that piece, without a collective: on one rank
    ``full_tensor()`` costs ~0.15 ms of DTensor dispatch per tensor, several ms per weight push."""
    if not isinstance(t, DTensor):
        return t
    local = t.to_local()
    if local.shape == t.shape and (t.device_mesh.size() == 1 or all(p.is_replicate() for p in t.placements)):
        return local
    return t.full_tensor()


def _lora_layers(model: nn.Module) -> dict:
    return {name: m for name, m in model.named_modules() if isinstance(m, LoraLayer)}


def _lora_delta(layer) -> torch.Tensor | None:
    """sum over active adapters of scaling * B @ A (full tensors; collective when sharded)."""
    delta = None
    for adapter in layer.active_adapters:
        if adapter not in getattr(layer, "lora_A", {}):
            continue
        a = _full(layer.lora_A[adapter].weight).float()
        b = _full(layer.lora_B[adapter].weight).float()
        d = (b @ a) * layer.scaling[adapter]
        if getattr(layer, "fan_in_fan_out", False):
            d = d.T
        delta = d if delta is None else delta + d
    return delta


def hf_name(key: str) -> str | None:
    """peft state-dict key -> base HF name; None for keys that are merged away (adapters, original copies)."""
    if "lora_" in key or ".original_module." in key:
        return None
    if key.startswith(_PEFT_PREFIX):
        key = key[len(_PEFT_PREFIX):]
    return key.replace(".base_layer.", ".").replace(".modules_to_save.default.", ".")


# full weights of a sharded model are gathered in buckets of at most this many bytes (one collective per bucket)
GATHER_BUCKET_BYTES = 256 << 20


def _dim0_shard_group(t: torch.Tensor):
    """The process group a DTensor is split over when it is FSDP2's layout -- rows (dim 0) sharded along one mesh
    dimension, replicated along any other -- and that group's backend can move the local piece; else None."""
    if not isinstance(t, DTensor):
        return None
    sharded = [i for i, p in enumerate(t.placements) if not p.is_replicate()]
    if len(sharded) != 1 or not (t.placements[sharded[0]].is_shard() and t.placements[sharded[0]].dim == 0):
        return None
    group = t.device_mesh.get_group(sharded[0])
    if (dist.get_backend(group) == "gloo") != (t.to_local().device.type == "cpu"):
        return None
    return group


def _gather_rows(tensors: list[DTensor], group) -> list[torch.Tensor]:
    """Full copies of row-sharded DTensors (same dtype, device and group) from one ``all_gather_into_tensor``.

    Rank r holds rows ``[r*c, min((r+1)*c, n))`` with ``c = ceil(n / world)`` (``torch.chunk``'s split, which FSDP2
    uses); each rank sends every tensor padded to ``c`` rows, and the rows past ``n`` are dropped on the way out.
    """
    world = dist.get_world_size(group)
    local = [t.to_local() for t in tensors]
    spans = []  # (rows per rank, elements per row)
    for t in tensors:
        rows = -(-t.shape[0] // world)
        spans.append((rows, math.prod(t.shape[1:])))
    width = sum(rows * row for rows, row in spans)
    send = torch.zeros(width, dtype=local[0].dtype, device=local[0].device)
    offset = 0
    for piece, (rows, row) in zip(local, spans):
        send[offset: offset + piece.numel()] = piece.reshape(-1)
        offset += rows * row
    recv = torch.empty(world * width, dtype=send.dtype, device=send.device)
    dist.all_gather_into_tensor(recv, send, group=group)
    recv = recv.view(world, width)
    out, offset = [], 0
    for t, (rows, row) in zip(tensors, spans):
        block = recv[:, offset: offset + rows * row].reshape(world * rows, *t.shape[1:])
        out.append(block[: t.shape[0]])  # the reshape of a column slice is already a copy
        offset += rows * row
    return out


def _full_in_buckets(items: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int = GATHER_BUCKET_BYTES
                     ) -> Iterator[tuple[str, torch.Tensor]]:
    """``(key, full tensor)`` in the order given; FSDP2-sharded tensors are gathered a bucket at a time (one
    collective per bucket instead of one ``full_tensor()`` per tensor: 57 -> 12 ms for a 4-layer model on two
    CPU ranks), everything else as :func:`_full` does. Every rank of the mesh must iterate in step."""
    bucket: list[tuple[str, DTensor]] = []
    size, key_of_bucket = 0, None

    def flush():
        nonlocal bucket, size
        full = _gather_rows([t for _, t in bucket], key_of_bucket[0]) if bucket else []
        done = [(name, tensor) for (name, _), tensor in zip(bucket, full)]
        bucket, size = [], 0
        return done

    for name, value in items:
        group = _dim0_shard_group(value)
        if group is None or dist.get_world_size(group) == 1:  # decided from global facts: the same on every rank
            yield from flush()
            yield name, _full(value)
            continue
        key = (group, value.dtype, value.to_local().device)
        nbytes = value.numel() * value.element_size()
        if bucket and (key != key_of_bucket or size + nbytes > bucket_bytes):
            yield from flush()
        key_of_bucket = key
        bucket.append((name, value))
        size += nbytes
    yield from flush()


def gathered_bytes(model: nn.Module) -> int:
    """Bytes one rank receives when the model's sharded state is gathered to full tensors (every shard but its
    own, per sharded tensor; replicated tensors move nothing)."""
    total = 0
    for value in model.state_dict().values():
        group = _dim0_shard_group(value)
        if group is not None and dist.get_world_size(group) > 1:
            total += (value.numel() - value.to_local().numel()) * value.element_size()
    return total


def iter_full_state_dict(model: nn.Module, dtype: torch.dtype | None = None, device: str | torch.device | None = "cpu",
                         bucket_bytes: int = GATHER_BUCKET_BYTES) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(hf_name, full_tensor)`` for every parameter/buffer, in state-dict order.

    Sharded DTensors are gathered a bucket at a time (at most ``bucket_bytes`` of full tensors at once; 0: one
    tensor at a time; a collective: every rank of the mesh must iterate in step). For a peft LoRA model the
    adapters are merged into their base weights (W + scaling * B A) one tensor at a time and the names are the
    base model's HF names. Tied weights (``lm_head.weight`` tied to the embeddings) are yielded under both names. Tensors are
    detached, on ``device`` (None: where they are) and cast to ``dtype`` if given.
    """
    peft = is_peft_model(model)
    lora = _lora_layers(model) if peft else {}
    with torch.no_grad():
        items = model.state_dict().items()
        if peft:
            items = ((key, value) for key, value in items if hf_name(key) is not None)
            stream = ((key, _full(value)) for key, value in items)
        else:
            stream = _full_in_buckets(items, bucket_bytes)
        for key, full in stream:
            name = hf_name(key) if peft else key
            full = full.detach()
            if peft and key.endswith(".base_layer.weight"):
                layer = lora.get(key[: -len(".base_layer.weight")])
                delta = _lora_delta(layer) if layer is not None else None
                if delta is not None:
                    full = (full.float() + delta.to(full.device)).to(full.dtype)
            if device is not None:
                full = full.to(device)
            if dtype is not None and full.is_floating_point():
                full = full.to(dtype)
            yield name, full


def get_full_state_dict(model: nn.Module, rank0_only: bool = False, dtype: torch.dtype | None = None
                        ) -> dict[str, torch.Tensor]:
    """All full tensors on CPU keyed by HF name (see :func:`iter_full_state_dict`); {} off rank 0 if rank0_only."""
    keep = not rank0_only or not dist.is_initialized() or dist.get_rank() == 0
    out, ptrs = {}, set()
    for name, tensor in iter_full_state_dict(model, dtype=dtype):
        if keep:
            if tensor.data_ptr() in ptrs:  # tied weights of an unsharded model: give each name its own tensor
                tensor = tensor.clone()
            ptrs.add(tensor.data_ptr())
            out[name] = tensor
    return out


def load_full_state_dict(model: nn.Module, state_dict: Mapping[str, torch.Tensor], strict: bool = True) -> None:
    """Copy full (unsharded, HF-named) tensors into a possibly sharded, possibly peft-wrapped model.

    Every rank passes the same full tensors; each keeps its own shard. For a peft model the base weights are
    loaded and the adapters are left as they are.
    """
    peft = is_peft_model(model)
    own = model.state_dict()
    seen = set()
    with torch.no_grad():
        for key, cur in own.items():
            name = hf_name(key) if peft else key
            if name is None:
                continue
            if name not in state_dict:
                if strict:
                    raise KeyError(f"load_full_state_dict: {name!r} missing from the given state dict")
                continue
            seen.add(name)
            full = state_dict[name].to(dtype=cur.dtype)
            if isinstance(cur, DTensor):
                shard = distribute_tensor(full.to(cur.device), cur.device_mesh, cur.placements, src_data_rank=None)
                cur.to_local().copy_(shard.to_local())
            else:
                cur.copy_(full.to(cur.device))
    extra = set(state_dict) - seen
    if strict and extra:
        raise KeyError(f"load_full_state_dict: unexpected keys {sorted(extra)[:5]}...")


# ------------------------------------------------------------------------------------------------ offload
def _on_accelerator() -> bool:
    return get_device_name() != "cpu"


def offload_fsdp_model_to_cpu(model: nn.Module, empty_cache: bool = True) -> None:
    """Move the (sharded) parameters to host memory between phases. No-op on CPU."""
    if not _on_accelerator():
        return
    model.cpu()
    if empty_cache:
        get_torch_device().empty_cache()


def load_fsdp_model_to_gpu(model: nn.Module) -> None:
    """Bring offloaded parameters back to this process's accelerator. No-op on CPU."""
    if not _on_accelerator():
        return
    model.to(torch.device(get_device_name(), get_torch_device().current_device()))


def offload_fsdp_optimizer(optimizer: torch.optim.Optimizer) -> None:
    """Move optimizer state tensors to host memory. No-op on CPU."""
    if not _on_accelerator() or not optimizer.state:
        return
    for state in optimizer.state.values():
        for k, v in state.items():
            if isinstance(v, torch.Tensor):
                state[k] = v.to("cpu", non_blocking=True)
    get_torch_device().synchronize()


def load_fsdp_optimizer(optimizer: torch.optim.Optimizer, device_id=None) -> None:
    """Move optimizer state tensors back to the accelerator. No-op on CPU."""
    if not _on_accelerator() or not optimizer.state:
        return
    device = torch.device(get_device_name(), get_torch_device().current_device() if device_id is None else device_id)
    for state in optimizer.state.values():
        for k, v in state.items():
            if isinstance(v, torch.Tensor):
                state[k] = v.to(device, non_blocking=True)
    get_torch_device().synchronize()
