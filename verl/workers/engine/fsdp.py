"""The FSDP2 training engine: a Hugging Face model sharded with ``fully_shard`` over gloo / nccl / hccl.

``FSDPEngine.build(EngineConfig, device_mesh)`` loads the model for its kind (causal LM, value model, reward
model), adds LoRA and gradient checkpointing when asked, shards it, and builds the optimizer and LR schedule
(``transformers`` schedules). ``FSDPEngine(module, optimizer, ...)`` wraps a model you built yourself (research
code, tests). The loop over epochs / mini-batches / micro-batches is the shared one in ``engine/base.py``.

Offload (``param_offload`` / ``optimizer_offload``): parameters / optimizer state live in host memory between
calls and come back to the accelerator for each forward or step. On CPU they already live in host memory, so
both are no-ops there.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import nullcontext

import torch
import torch.distributed as dist
from torch import nn

from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager
from verl.utils.chunked_head import output_layer
from verl.utils.checkpoint.hf_export import save_hf_model_dir
from verl.utils.compile import compile_decoder_layers
from verl.utils.device import get_device_name, module_device
from verl.utils.fsdp_utils import (GATHER_BUCKET_BYTES, apply_fsdp2, apply_lora, build_lr_scheduler, build_optimizer, clip_grad_norm_,
                                   enable_gradient_checkpointing, gathered_bytes, is_peft_model, iter_full_state_dict,
                                   load_fsdp_model_to_gpu, load_fsdp_optimizer, load_lora_adapter,
                                   offload_fsdp_model_to_cpu, offload_fsdp_optimizer)
from verl.utils.model import freeze_vision_tower, load_causal_lm, load_reward_model, load_value_model
from verl.utils.ulysses import UlyssesGroups, check_ulysses_size, init_ulysses_groups
from verl.workers.engine.base import TrainEngine
from verl.utils.varlen_attention import packs_with_varlen_attention, use_varlen_attention
from verl.workers.engine.config import EngineConfig, compile_key
from verl.workers.engine.hf_forward import forward_log_probs, forward_logits, forward_scores, forward_values
from verl.workers.engine.shared_prompt import (forward_grouped_log_probs, forward_grouped_values,
                                               forward_shared_prompt_log_probs, unsupported_reason)
from verl.workers.engine.ulysses import sp_forward_log_probs, sp_forward_values, ulysses_attention_active

__all__ = ["FSDPEngine"]

logger = logging.getLogger(__name__)

_LOADERS = {"causal_lm": load_causal_lm, "value": load_value_model, "reward": load_reward_model}


def _default_dp_group():
    return dist.group.WORLD if dist.is_available() and dist.is_initialized() else None


class FSDPEngine(TrainEngine):
    """An (FSDP2-sharded or plain) HF model with its optimizer; see the module docstring.

    Args:
        module: the model (already sharded, or plain for one process).
        optimizer / lr_scheduler: None for a frozen, forward-only engine (reference policy, reward model).
        dp_group: the group gradients are averaged over (default: all ranks).
        use_remove_padding: pack (flash attention) or trim (elsewhere) padding away; see ``hf_forward``.
        grad_clip: max gradient norm (None: no clipping).
        param_offload / optimizer_offload: keep them in host memory between calls (accelerators only).
        checkpoint_config: ``save_contents`` / ``load_contents`` of verl's ``checkpoint`` section.
        tokenizer: saved beside checkpoints (``huggingface/``).
        ulysses: sequence-parallel groups (``verl.utils.ulysses``); with ``sp_size > 1`` each micro-batch's packed
            sequence is split over the sp group and ``dp_group`` defaults to the data-parallel group.
    """

    def __init__(self, module: nn.Module, optimizer: torch.optim.Optimizer | None = None, lr_scheduler=None, *,
                 dp_group=None, use_remove_padding: bool = False, grad_clip: float | None = None,
                 param_offload: bool = False, optimizer_offload: bool = False, checkpoint_config=None,
                 tokenizer=None, name: str = "engine", ulysses: UlyssesGroups | None = None,
                 share_prompt_prefix: bool = False, fused_chunk_size: int = 0):
        self.module = module
        # model.use_fused_kernels: log-probs / entropies from hidden states in chunks (no [tokens, vocab] logits)
        self.fused_chunk_size = int(fused_chunk_size)
        if self.fused_chunk_size and output_layer(module) is None:
            raise ValueError(f"{name}: actor_rollout_ref.model.use_fused_kernels=True needs a causal LM whose output "
                             "layer is a bias-free linear layer; set it to False for this model")
        self.ulysses = ulysses if ulysses is not None and ulysses.sp_size > 1 else None
        if self.ulysses is not None:
            if not use_remove_padding:
                raise ValueError(f"{name}: ulysses_sequence_parallel_size={ulysses.sp_size} needs "
                                 "use_remove_padding=True (the packed sequence is what is split across ranks)")
            if dp_group is None:
                dp_group = ulysses.dp_group
        self.optimizer = optimizer
        self.lr_scheduler = lr_scheduler
        self.dp_group = dp_group if dp_group is not None else _default_dp_group()
        self.use_remove_padding = bool(use_remove_padding)
        self.grad_clip = grad_clip
        self.param_offload = bool(param_offload)
        self.optimizer_offload = bool(optimizer_offload)
        self.checkpoint_config = checkpoint_config
        self.tokenizer = tokenizer
        self.name = name
        self._checkpoint_manager = None
        self._offloaded = False
        # rows that share a prompt (rollout.n samples) are computed as one packed row when that saves compute
        self.share_prompt_prefix = bool(share_prompt_prefix)
        self._told_grouped = False
        if self.share_prompt_prefix:
            reason = self.shared_prompt_unsupported()
            if reason is not None:
                logger.info("%s: share_prompt_prefix is off: %s", name, reason)
                self.share_prompt_prefix = False

    # ------------------------------------------------------------------ building
    @classmethod
    def build(cls, config: EngineConfig, device_mesh=None, tokenizer=None) -> "FSDPEngine":
        """Load, adapt, shard and equip a model as ``config`` says (identical initialisation on every rank)."""
        if str(config.router_replay or "disabled") != "disabled":
            raise ValueError(f"{config.name}.router_replay.mode={config.router_replay}: router replay records and "
                             "replays megatron-core's router decisions; the FSDP engine runs the Hugging Face model, "
                             "whose routers cannot replay; use strategy=megatron or router_replay.mode=disabled")
        torch.manual_seed(config.seed)
        module = _LOADERS[config.model_kind](config.model_path, dtype=config.model_dtype,
                                             override_config=config.override_config,
                                             trust_remote_code=config.trust_remote_code)
        if config.model_kind == "reward" and getattr(module.config, "pad_token_id", None) is None:
            # the classifier's own pooling (unused: the engine reads every position) refuses batches without it
            module.config.pad_token_id = 0
        trainable = config.optim is not None
        if not trainable:
            module.requires_grad_(False)
        elif config.lora_adapter_path:  # a saved adapter, trained further (its base weights stay frozen)
            module.enable_input_require_grads()
            module = load_lora_adapter(module, config.lora_adapter_path)
        elif config.lora_rank > 0:
            module.enable_input_require_grads()
            module = apply_lora(module, config.lora_rank, lora_alpha=config.lora_alpha,
                                target_modules=config.target_modules, exclude_modules=config.exclude_modules)
        if trainable and config.freeze_vision_tower:
            frozen = freeze_vision_tower(module, key=f"{config.name}.freeze_vision_tower")
            logger.warning("%s: freeze_vision_tower: %d vision-tower parameter tensors frozen", config.name, frozen)
        if trainable and config.enable_gradient_checkpointing:
            enable_gradient_checkpointing(module)
        ulysses = None
        if config.ulysses_sequence_parallel_size > 1:
            hf_config = module.config
            check_ulysses_size(config.ulysses_sequence_parallel_size, dist.get_world_size(),
                               getattr(hf_config, "num_attention_heads", None),
                               getattr(hf_config, "num_key_value_heads", None),
                               key=f"{config.name}.ulysses_sequence_parallel_size")
            ulysses = init_ulysses_groups(config.ulysses_sequence_parallel_size)
        if config.use_remove_padding and ulysses is None and packs_with_varlen_attention(get_device_name()):
            use_varlen_attention(module)  # packed rows, attention per sequence (flash models pack natively)
        if config.use_torch_compile:
            compile_decoder_layers(module, key=compile_key(config.name))
        module = apply_fsdp2(module, config.fsdp, device_mesh)
        optimizer = scheduler = None
        if trainable:
            optimizer = build_optimizer(module.parameters(), config.optim)
            scheduler = build_lr_scheduler(optimizer, config.optim, config.total_training_steps)
        engine = cls(module, optimizer, scheduler, use_remove_padding=config.use_remove_padding,
                     grad_clip=config.grad_clip, param_offload=config.param_offload,
                     optimizer_offload=config.optimizer_offload, checkpoint_config=config.checkpoint,
                     tokenizer=tokenizer, name=config.name, ulysses=ulysses,
                     share_prompt_prefix=config.share_prompt_prefix, fused_chunk_size=config.fused_chunk_size)
        engine.entropy_chunk_rows = config.entropy_chunk_rows
        engine.offload()
        return engine

    # ------------------------------------------------------------------ TrainEngine
    @property
    def device(self) -> torch.device:
        return module_device(self.module)

    @property
    def dp_size(self) -> int:
        return dist.get_world_size(self.dp_group) if self.dp_group is not None else 1

    @property
    def model_config(self):
        """The Hugging Face config of the model (what a rollout engine needs to know about it)."""
        return getattr(self.module, "config", None)

    def forward_micro_batch(self, micro, outputs, temperature, entropy_grad):
        if self.ulysses is not None:
            return self._sp_forward_micro_batch(micro, outputs, temperature, entropy_grad)
        out = {}
        if "log_probs" in outputs or "entropy" in outputs:
            grouped = None
            if self.share_prompt_prefix:
                grouped = forward_grouped_log_probs(self.module, micro, temperature, "entropy" in outputs,
                                                    entropy_grad)
                if grouped is not None and not self._told_grouped:
                    self._told_grouped = True
                    logger.warning("%s: rows that share a prompt are computed as one packed row per prompt "
                                   "(share_prompt_prefix)", self.name)
            entropy, log_probs = grouped if grouped is not None else forward_log_probs(
                self.module, micro, temperature, "entropy" in outputs, self.use_remove_padding, entropy_grad,
                self.fused_chunk_size)
            out["log_probs"] = log_probs
            if entropy is not None:
                out["entropy"] = entropy
        if "values" in outputs:
            values = forward_grouped_values(self.module, micro) if self.share_prompt_prefix else None
            out["values"] = values if values is not None else forward_values(self.module, micro,
                                                                             self.use_remove_padding)
        if "scores" in outputs:
            out["scores"] = forward_scores(self.module, micro, self.use_remove_padding)
        if "logits" in outputs:
            out["logits"] = forward_logits(self.module, micro, temperature, self.use_remove_padding)
        return out

    def shared_prompt_unsupported(self) -> str | None:
        if self.ulysses is not None:
            return "sequence parallelism (ulysses_sequence_parallel_size > 1) splits packed rows across ranks"
        return unsupported_reason(self.module)

    def forward_shared_prompt(self, micro, outputs, temperature, entropy_grad):
        reason = self.shared_prompt_unsupported()
        if reason is not None:
            raise ValueError(f"{self.name}: pairs cannot share their prompt: {reason}")
        other = set(outputs) - {"log_probs", "entropy"}
        if other:
            raise ValueError(f"{self.name}: a packed-pair forward computes log_probs and entropy, not {sorted(other)}")
        entropy, log_probs = forward_shared_prompt_log_probs(self.module, micro, temperature, "entropy" in outputs,
                                                             entropy_grad)
        out = {"log_probs": log_probs}
        if entropy is not None:
            out["entropy"] = entropy
        return out

    def _sp_forward_micro_batch(self, micro, outputs, temperature, entropy_grad):
        group, out = self.ulysses.sp_group, {}
        if "logits" in outputs:
            raise NotImplementedError(f"{self.name}: full logits are not computed with ulysses_sequence_parallel_size"
                                      " > 1; use 1 for a distillation loss over the vocabulary")
        if "scores" in outputs:
            raise NotImplementedError(f"{self.name}: sequence-classifier scores are not computed with "
                                      "ulysses_sequence_parallel_size > 1; use 1 for a reward model")
        with ulysses_attention_active(self.module):
            if "log_probs" in outputs or "entropy" in outputs:
                entropy, out["log_probs"] = sp_forward_log_probs(self.module, micro, group, temperature,
                                                                 "entropy" in outputs, entropy_grad)
                if entropy is not None:
                    out["entropy"] = entropy
            if "values" in outputs:
                out["values"] = sp_forward_values(self.module, micro, group)
        return out

    def forward_backward(self, micro, loss_fn, spec, ctx, weight):
        if self.ulysses is None:
            return super().forward_backward(micro, loss_fn, spec, ctx, weight)
        # the backward (recomputed layers under gradient checkpointing included) attends over the sp group too
        with ulysses_attention_active(self.module):
            return super().forward_backward(micro, loss_fn, spec, ctx, weight)

    def train_mode(self, training: bool) -> None:
        self.module.train(training)

    def zero_grad(self) -> None:
        self._require_optimizer()
        self.optimizer.zero_grad(set_to_none=True)

    def set_grad_sync(self, enabled: bool) -> None:
        sync = getattr(self.module, "set_requires_gradient_sync", None)
        if sync is not None:
            sync(enabled)

    def optimizer_step(self) -> float:
        self._require_optimizer()
        grad_norm = clip_grad_norm_(self.module.parameters(), self.grad_clip)
        if torch.isfinite(torch.tensor(grad_norm)):
            if self.optimizer_offload:
                load_fsdp_optimizer(self.optimizer)
            self.optimizer.step()
        else:
            logger.warning("%s: non-finite grad norm %s, skipping this optimizer step", self.name, grad_norm)
        self.optimizer.zero_grad(set_to_none=True)
        return grad_norm

    def iter_full_params(self, stats: dict | None = None,
                         bucket_bytes: int = GATHER_BUCKET_BYTES) -> Iterator[tuple[str, torch.Tensor]]:
        self.onload()
        if stats is not None:  # the bucketed all-gather brings every rank the shards it does not hold
            stats["recv_bytes"] = gathered_bytes(self.module)
        try:
            for name, tensor in iter_full_state_dict(self.module, bucket_bytes=bucket_bytes):
                if not name.endswith("rotary_emb.inv_freq"):  # a derived buffer, not a weight
                    yield name, tensor
        finally:
            self.offload()

    def onloaded(self, tensors: Iterator[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
        """Stream ``tensors`` (read from this engine's module) with the parameters on the device meanwhile."""
        self.onload()
        try:
            yield from tensors
        finally:
            self.offload()

    def offload(self) -> None:
        if self.param_offload:
            offload_fsdp_model_to_cpu(self.module)
        if self.optimizer_offload and self.optimizer is not None:
            offload_fsdp_optimizer(self.optimizer)

    def onload(self) -> None:
        if self.param_offload:
            load_fsdp_model_to_gpu(self.module)

    def disable_adapter(self):
        return self.module.disable_adapter() if is_peft_model(self.module) else nullcontext()

    # ------------------------------------------------------------------ checkpoints
    def _checkpointer(self) -> FSDPCheckpointManager:
        self._require_optimizer()
        if self._checkpoint_manager is None:
            self._checkpoint_manager = FSDPCheckpointManager(
                model=self.module, optimizer=self.optimizer, lr_scheduler=self.lr_scheduler,
                processing_class=self.tokenizer, checkpoint_config=self.checkpoint_config)
        return self._checkpoint_manager

    def save_checkpoint(self, local_path: str, global_step: int = 0, max_ckpt_to_keep: int | None = None) -> None:
        self.onload()
        try:
            self._checkpointer().save_checkpoint(local_path=local_path, global_step=global_step,
                                                 max_ckpt_to_keep=max_ckpt_to_keep)
        finally:
            self.offload()

    def load_checkpoint(self, local_path: str, del_local_after_load: bool = False) -> None:
        self.onload()
        try:
            self._checkpointer().load_checkpoint(local_path=local_path, del_local_after_load=del_local_after_load)
        finally:
            self.offload()

    def save_hf_model(self, out_dir: str, tokenizer=None) -> str | None:
        self.onload()
        try:
            rank = dist.get_rank() if dist.is_initialized() else 0
            return save_hf_model_dir(self.module, tokenizer or self.tokenizer, out_dir, rank=rank)
        finally:
            self.offload()

    def _require_optimizer(self) -> None:
        if self.optimizer is None:
            raise RuntimeError(f"{self.name}: this engine is forward-only (built without an optimizer); training "
                               "and checkpoints need one")
