"""The training-engine seam: one interface that owns the training loop, whatever shards the model.

A role (actor, critic, reference, reward model, SFT, a recipe's DPO/KTO/RM head) never touches FSDP or
Megatron objects. It hands the engine a batch and a *loss function* and gets metrics back::

    engine = build_engine(engine_config)            # model, optimizer, LR schedule, sharding
    metrics = engine.train_batch(data, loss_fn, spec)   # epochs x mini-batches x micro-batches, one step each
    out = engine.infer(data, ("log_probs", "entropy"), micro)   # forward only, original row order
    for name, tensor in engine.iter_full_params(): ...      # HF names, full tensors (the rollout weight push)
    engine.save_checkpoint(path, step) / engine.load_checkpoint(path)

What the engine computes is named by *outputs* of the forward pass, all aligned to the response (the last
``R = responses.shape[1]`` columns of ``input_ids``):

============  ======  ===================================================================================
``log_probs`` (B, R)  log pi(response token t | tokens < t) after dividing the logits by ``temperature``
``entropy``   (B, R)  entropy of that next-token distribution
``values``    (B, R)  value head at the position *before* each response token (the PPO critic's V(s_t))
``scores``    (B, T)  a sequence classifier's head at every position of the whole sequence (reward models)
``logits``    (B,R,V) the next-token logits (divided by ``temperature``) that score each response token: full
                      distributions for distillation losses (FSDP engine without sequence parallel only)
``routed_``   (B,T,   a mixture-of-experts model's top-k experts of every token in every MoE layer at the columns
``experts``   L, k)   of ``input_ids`` (integers; zeros at padding): recorded for router replay (Megatron engine
                      built with ``router_replay="R2"``; see ``verl.models.mcore.router_replay``)
============  ======  ===================================================================================

Router replay: a micro-batch that carries ``routed_experts`` (a batch key of the update, or a key ``infer`` is told
to carry) is computed with exactly those experts, in the forward and in any recomputation during backward.

A supervised loss over a whole sequence uses ``responses = input_ids[:, 1:]``: then ``log_probs`` covers every
next-token prediction.

Loss functions have the signature ``loss_fn(outputs, micro_batch, ctx) -> (loss, metrics)`` where ``outputs``
holds the requested tensors for the micro-batch, ``micro_batch`` is its TensorDict (on the model's device) and
``ctx`` a :class:`LossContext`. The loss is the *mean* over the micro-batch in the unit the spec weights by
(tokens of ``mask_key`` or sequences): the engine scales it by the micro-batch's share of the global mini-batch
(counted over all data-parallel ranks), so an update equals the loss over the whole global mini-batch however it
is cut into micro-batches and ranks.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from dataclasses import dataclass

import torch

from verl.protocol import DataProto
from verl.utils.dataset.vision_utils import MM_KEYS
from verl.utils.seqlen_balancing import global_count, make_micro_batches, restore_dynamic_batch
from verl.utils.torch_functional import entropy_chunking

__all__ = ["TrainEngine", "MicroBatchSpec", "TrainSpec", "LossContext", "OUTPUTS"]

logger = logging.getLogger(__name__)

OUTPUTS = ("log_probs", "entropy", "values", "scores", "logits", "routed_experts")


@dataclass(frozen=True)
class MicroBatchSpec:
    """How a per-rank batch is cut for forward passes: fixed rows, or a token budget (``use_dynamic_bsz``)."""

    micro_batch_size: int | None = None
    use_dynamic_bsz: bool = False
    max_token_len: int | None = None


@dataclass(frozen=True)
class TrainSpec:
    """One ``train_batch`` call: ``epochs`` passes over ``mini_batch_size``-row mini-batches (rows per rank),
    one optimizer step per mini-batch.

    ``weight_by``: "tokens" (count ``mask_key`` tokens: token-mean losses) or "sequences" (rows: seq-mean
    losses). ``outputs``: what the forward computes for the loss. ``entropy_grad=False`` keeps no graph for the
    entropy (a metric). ``shuffle`` reorders rows each epoch with ``seed + epoch``. ``reduce_grads_once`` defers
    the cross-rank gradient reduction to the last micro-batch of a step (one collective instead of one per
    micro-batch). ``grad_norm_key`` names the per-step gradient-norm metric. ``shared_prompt``: the rows are
    interleaved preference pairs (rows ``2i``, ``2i + 1`` answer the same prompt) and each pair is computed as one
    packed sequence that runs the prompt once (:meth:`TrainEngine.forward_shared_prompt`).
    """

    mini_batch_size: int
    micro: MicroBatchSpec = MicroBatchSpec()
    epochs: int = 1
    shuffle: bool = False
    seed: int = 42
    weight_by: str = "tokens"
    mask_key: str = "response_mask"
    outputs: tuple[str, ...] = ("log_probs",)
    temperature: float = 1.0
    entropy_grad: bool | str = True  # "checkpoint": differentiable, recomputed in backward (entropy_for_loss)
    reduce_grads_once: bool = False
    grad_norm_key: str = "grad_norm"
    shared_prompt: bool = False

    def __post_init__(self):
        if self.mini_batch_size <= 0:
            raise ValueError(f"mini_batch_size must be > 0 rows per rank, got {self.mini_batch_size}")
        if self.weight_by not in ("tokens", "sequences"):
            raise ValueError(f"weight_by={self.weight_by!r} is not one of: tokens, sequences")
        unknown = set(self.outputs) - set(OUTPUTS)
        if unknown:
            raise ValueError(f"unknown engine outputs {sorted(unknown)}; choose from {OUTPUTS}")
        if "routed_experts" in self.outputs:
            raise ValueError("routed_experts is recorded by a forward-only pass (infer), not by a training step")
        if self.shared_prompt:
            _check_pair_micro(self.micro)
            if self.mini_batch_size % 2 or self.shuffle:
                raise ValueError("shared_prompt needs whole pairs in every mini-batch: an even mini_batch_size "
                                 "and shuffle=False")


@dataclass(frozen=True)
class LossContext:
    """Where in ``train_batch`` a loss call sits (a loss may act on the first mini-batch only, say)."""

    epoch: int
    mini_batch: int
    micro_batch: int
    num_micro_batches: int


def _check_pair_micro(micro: MicroBatchSpec) -> None:
    if micro.use_dynamic_bsz or (micro.micro_batch_size is not None and micro.micro_batch_size % 2):
        raise ValueError("shared_prompt computes interleaved pairs: micro-batches need an even number of rows and "
                         "no dynamic batch size")


LossFn = Callable[[dict, "object", LossContext], "tuple[torch.Tensor, dict]"]


def _as_float(x) -> float:
    return float(x.detach().item()) if isinstance(x, torch.Tensor) else float(x)


class TrainEngine(ABC):
    """A model, its optimizer and LR schedule, sharded over a data-parallel group; see the module docstring.

    Subclasses implement the model-specific parts (:meth:`forward_micro_batch`, :meth:`optimizer_step`,
    the gradient bookkeeping, parameters and checkpoints); the batching loop here is shared.
    """

    #: the process group gradients are averaged over (None: a single process)
    dp_group = None
    #: ``<role>.entropy_from_logits_with_chunking``: logit rows per chunk of the entropy (0: all at once)
    entropy_chunk_rows = 0

    # ------------------------------------------------------------------ what an engine implements
    @property
    @abstractmethod
    def device(self) -> torch.device: ...

    @property
    @abstractmethod
    def dp_size(self) -> int: ...

    @abstractmethod
    def forward_micro_batch(self, micro, outputs: tuple[str, ...], temperature: float, entropy_grad: bool) -> dict:
        """The requested outputs (see module docstring) for one micro-batch already on :attr:`device`."""

    @abstractmethod
    def zero_grad(self) -> None: ...

    @abstractmethod
    def optimizer_step(self) -> float:
        """Clip, step (skipped on a non-finite norm), zero the gradients; returns the pre-clip gradient norm."""

    #: set by subclasses that train (None: a forward-only engine)
    optimizer = None
    lr_scheduler = None

    def lr_scheduler_step(self) -> float:
        """Advance the LR schedule one step; returns the learning rate that the finished step used."""
        lr = self.current_lr()
        if self.lr_scheduler is not None:
            self.lr_scheduler.step()
        return lr

    def current_lr(self) -> float:
        if self.lr_scheduler is not None and hasattr(self.lr_scheduler, "get_last_lr"):
            return float(self.lr_scheduler.get_last_lr()[0])
        return float(self.optimizer.param_groups[0]["lr"]) if self.optimizer is not None else 0.0

    @abstractmethod
    def iter_full_params(self, stats: dict | None = None,
                         bucket_bytes: int | None = None) -> Iterator[tuple[str, torch.Tensor]]:
        """Full (gathered) parameters under Hugging Face names, one tensor at a time (LoRA merged);
        ``stats["recv_bytes"]``: bytes this rank receives from other ranks to build them. ``bucket_bytes``: how much
        to gather per collective where the engine gathers in buckets (0: one parameter at a time)."""

    @abstractmethod
    def save_checkpoint(self, local_path: str, global_step: int = 0, max_ckpt_to_keep: int | None = None) -> None: ...

    @abstractmethod
    def load_checkpoint(self, local_path: str, del_local_after_load: bool = False) -> None: ...

    @abstractmethod
    def save_hf_model(self, out_dir: str, tokenizer=None) -> str | None:
        """Write the full model as a Hugging Face directory (collective; rank 0 writes, atomically)."""

    def set_grad_sync(self, enabled: bool) -> None:
        """Whether the next backward reduces gradients across ranks (see ``TrainSpec.reduce_grads_once``)."""

    def train_mode(self, training: bool) -> None:
        """Switch the model between training and evaluation behaviour (dropout)."""

    def offload(self) -> None:
        """Move parameters / optimizer state to host memory when the config asks for it (no-op on CPU)."""

    def onload(self) -> None:
        """Bring them back before the next forward or step."""

    def disable_adapter(self):
        """Context in which a LoRA model computes with its adapters off (the reference policy)."""
        return nullcontext()

    def routing_replay_unsupported(self) -> str | None:
        """None when this engine records and replays mixture-of-experts routing (``routed_experts``); else why not."""
        return (f"the {type(self).__name__} engine does not record or replay mixture-of-experts routing (router "
                "replay is the Megatron engine's, built with actor.router_replay.mode=R2)")

    def shared_prompt_unsupported(self) -> str | None:
        """None when :meth:`forward_shared_prompt` is exact for this engine's model; otherwise why not."""
        return f"the {type(self).__name__} engine has no packed-pair forward"

    def forward_shared_prompt(self, micro, outputs: tuple[str, ...], temperature: float, entropy_grad: bool) -> dict:
        """Like :meth:`forward_micro_batch` for interleaved preference pairs, each pair computed as one packed
        sequence ``[prompt | chosen | rejected]`` (``log_probs`` / ``entropy`` only)."""
        raise NotImplementedError(self.shared_prompt_unsupported())

    # ------------------------------------------------------------------ the shared loop
    def infer(self, data: DataProto, outputs: tuple[str, ...], micro: MicroBatchSpec,
              temperature: float = 1.0, shared_prompt: bool = False,
              carry: tuple[str, ...] = ()) -> dict[str, torch.Tensor]:
        """Forward only (no gradients): the requested outputs for every row, in the input's row order, on CPU.
        ``shared_prompt``: the rows are interleaved pairs, computed packed (see ``TrainSpec.shared_prompt``).
        ``carry``: batch keys the micro-batches take along besides the model inputs (``routed_experts``: that
        routing is replayed)."""
        if shared_prompt:
            _check_pair_micro(micro)
        if "routed_experts" in outputs or "routed_experts" in carry:
            reason = self.routing_replay_unsupported()
            if reason is not None:
                raise ValueError(reason)
        forward = self.forward_shared_prompt if shared_prompt else self.forward_micro_batch
        keys = [k for k in ("responses", "input_ids", "attention_mask", "position_ids", *MM_KEYS, *carry)
                if k in data.batch.keys()]
        missing = [k for k in carry if k not in data.batch.keys()]
        if missing:
            raise KeyError(f"infer(carry={tuple(carry)}): the batch has no {missing}")
        micro_batches, partitions = make_micro_batches(data.batch.select(*keys), micro.micro_batch_size,
                                                       micro.use_dynamic_bsz, micro.max_token_len, self.dp_group)
        self.onload()
        self.train_mode(False)
        results = defaultdict(list)
        try:
            with torch.no_grad(), entropy_chunking(self.entropy_chunk_rows):
                for mb in micro_batches:
                    out = forward(mb.to(self.device), outputs, temperature, entropy_grad=False)
                    for name in outputs:
                        value = out[name]  # floating outputs as fp32; integer ones (routed experts) as they are
                        results[name].append((value.float() if value.is_floating_point() else value).cpu())
        finally:
            self.offload()
        merged = {name: torch.cat(parts, dim=0) for name, parts in results.items()}
        if partitions is not None:
            merged = {name: restore_dynamic_batch(t, partitions) for name, t in merged.items()}
        return merged

    def forward_backward(self, micro, loss_fn: LossFn, spec: TrainSpec, ctx: LossContext, weight: float) -> dict:
        """One micro-batch of a training step: forward, loss, backward of ``loss * weight``; returns the loss's
        metrics. Pipeline-parallel engines override it to run the micro-batch through their stages."""
        forward = self.forward_shared_prompt if spec.shared_prompt else self.forward_micro_batch
        with entropy_chunking(self.entropy_chunk_rows):
            out = forward(micro, spec.outputs, spec.temperature, spec.entropy_grad)
        loss, loss_metrics = loss_fn(out, micro, ctx)
        (loss * weight).backward()
        return loss_metrics

    def _mini_batches(self, data: DataProto, spec: TrainSpec, epoch: int) -> list[DataProto]:
        if spec.shuffle:
            gen = torch.Generator().manual_seed(int(spec.seed) + epoch)
            data = data.select_idxs(torch.randperm(len(data), generator=gen).numpy())
        return data.split(spec.mini_batch_size)

    def train_batch(self, data: DataProto, loss_fn: LossFn, spec: TrainSpec) -> dict[str, list[float]]:
        """``spec.epochs`` x mini-batches of ``data`` (this rank's rows), one optimizer step per mini-batch.

        Returns metrics as lists: whatever ``loss_fn`` reported per micro-batch, plus ``spec.grad_norm_key`` per
        step. Each micro-batch loss is weighted by its share of the global mini-batch times the dp size (the
        gradient reduction averages over ranks), so the step is exactly that of the global mini-batch's loss.
        """
        metrics: dict[str, list[float]] = defaultdict(list)
        world = self.dp_size
        per_token = spec.weight_by == "tokens"
        self.onload()
        self.train_mode(True)
        try:
            for epoch in range(spec.epochs):
                for mb_index, mini_batch in enumerate(self._mini_batches(data, spec, epoch)):
                    total = global_count(mini_batch.batch[spec.mask_key], per_token, self.dp_group)
                    micro_batches, _ = make_micro_batches(mini_batch.batch, spec.micro.micro_batch_size,
                                                          spec.micro.use_dynamic_bsz, spec.micro.max_token_len,
                                                          self.dp_group)
                    self.zero_grad()
                    for i, micro in enumerate(micro_batches):
                        if spec.reduce_grads_once:
                            self.set_grad_sync(i == len(micro_batches) - 1)
                        micro = micro.to(self.device)
                        ctx = LossContext(epoch, mb_index, i, len(micro_batches))
                        mask = micro[spec.mask_key]
                        share = (mask.sum().item() if per_token else mask.shape[0]) / max(total, 1.0)
                        loss_metrics = self.forward_backward(micro, loss_fn, spec, ctx, share * world)
                        for name, value in loss_metrics.items():
                            metrics[name].append(_as_float(value))
                    self.set_grad_sync(True)
                    metrics[spec.grad_norm_key].append(self.optimizer_step())
        finally:
            self.offload()
        return dict(metrics)
