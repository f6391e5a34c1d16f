"""Data-parallel PPO critic on an FSDP2-sharded (or plain) token-classification model (one value per token).

Keys of ``critic``: ``ppo_mini_batch_size`` (rows per rank, already normalised by the worker like the actor's),
``ppo_micro_batch_size_per_gpu``, ``forward_micro_batch_size_per_gpu`` (or ``meta_info["micro_batch_size"]``),
``use_dynamic_bsz`` with ``ppo_max_token_len_per_gpu`` / ``forward_max_token_len_per_gpu`` (or
``meta_info["max_token_len"]``), ``ppo_epochs``, ``shuffle``, ``cliprange_value``, ``loss_agg_mode``,
``grad_clip`` (or ``optim.clip_grad``), ``model.use_remove_padding`` / ``use_remove_padding``.
Gradient accumulation is weighted exactly like the actor's (share of the global mini-batch).
"""

from __future__ import annotations

import logging
from collections import defaultdict

import torch
from torch import nn

from verl.protocol import DataProto
from verl.trainer.ppo.core_algos import compute_value_loss
from verl.utils.fsdp_utils import cfg_get, clip_grad_norm_
from verl.utils.device import module_device
from verl.utils.padding import (pack_batch, place_response_window, remove_padding_mode, response_window,
                                unpack_to_padded, valid_column_span)
from verl.utils.seqlen_balancing import global_count, make_micro_batches, restore_dynamic_batch
from verl.utils.torch_functional import masked_mean
from verl.workers.actor.dp_actor import _item, default_dp_group, dp_world_size
from verl.workers.critic.base import BasePPOCritic

logger = logging.getLogger(__name__)

__all__ = ["DataParallelPPOCritic"]


def _token_values(output) -> torch.Tensor:
    """Per-token values from a model output: ``logits[..., 0]`` of a token classifier, or a value-head tuple."""
    if hasattr(output, "logits"):
        return output.logits[..., 0] if output.logits.dim() == 3 else output.logits
    if isinstance(output, tuple) and len(output) >= 3:  # (lm_logits, loss, values) value-head models
        return output[2]
    raise TypeError(f"cannot read values from a model output of type {type(output).__name__}")


def forward_values(module: nn.Module, micro_batch, use_remove_padding: bool = False) -> torch.Tensor:
    """Values (B, R) for the states preceding each response token (position t predicts token t+1)."""
    input_ids = micro_batch["input_ids"]
    attention_mask = micro_batch["attention_mask"]
    response_length = micro_batch["responses"].shape[-1]
    batch, seqlen = input_ids.shape
    mode = remove_padding_mode(module) if use_remove_padding else "padded"
    if mode == "pack":
        ids, pos, indices, _ = pack_batch(input_ids, attention_mask, micro_batch["position_ids"])
        values = _token_values(module(input_ids=ids, attention_mask=None, position_ids=pos, use_cache=False))
        values = unpack_to_padded(values[0], indices, batch, seqlen)
        return values[:, -response_length - 1 : -1].float()
    # "trim": compute only the columns that hold a valid token in some row (see verl.utils.padding)
    lo, hi = valid_column_span(attention_mask) if mode == "trim" else (0, seqlen)
    s, e = response_window(seqlen, response_length, lo, hi)
    values = _token_values(module(input_ids=input_ids[:, lo:hi], attention_mask=attention_mask[:, lo:hi],
                                  position_ids=micro_batch["position_ids"][..., lo:hi], use_cache=False))
    return place_response_window(values[:, s - lo : e - lo].float(), response_length,
                                 s - (seqlen - response_length - 1))


class DataParallelPPOCritic(BasePPOCritic):
    def __init__(self, config, critic_module: nn.Module, critic_optimizer: torch.optim.Optimizer | None = None,
                 dp_group=None):
        super().__init__(config)
        self.critic_module = critic_module
        self.critic_optimizer = critic_optimizer
        self.dp_group = dp_group if dp_group is not None else default_dp_group()
        self.use_remove_padding = bool(cfg_get(config, "use_remove_padding",
                                               cfg_get(config, "model.use_remove_padding", False)))

    def _forward_micro_batch(self, micro_batch) -> torch.Tensor:
        return forward_values(self.critic_module, micro_batch, self.use_remove_padding)

    def compute_values(self, data: DataProto) -> torch.Tensor:
        cfg, meta = self.config, data.meta_info
        use_dynamic_bsz = meta.get("use_dynamic_bsz", cfg_get(cfg, "use_dynamic_bsz", False))
        micro_bsz = meta.get("micro_batch_size") or cfg_get(cfg, "forward_micro_batch_size_per_gpu", None) or \
            cfg_get(cfg, "ppo_micro_batch_size_per_gpu", None)
        max_token_len = meta.get("max_token_len") or cfg_get(cfg, "forward_max_token_len_per_gpu", None) or \
            cfg_get(cfg, "ppo_max_token_len_per_gpu", None)
        batch = data.batch.select("responses", "input_ids", "attention_mask", "position_ids")
        micro_batches, partitions = make_micro_batches(batch, micro_bsz, bool(use_dynamic_bsz), max_token_len,
                                                       self.dp_group)
        device = module_device(self.critic_module)  # batches arrive on CPU; values go back there
        with torch.no_grad():
            values = torch.cat([self._forward_micro_batch(m.to(device)).cpu() for m in micro_batches], dim=0)
        if partitions is not None:
            values = restore_dynamic_batch(values, partitions)
        response_length = data.batch["responses"].shape[-1]
        mask = data.batch["response_mask"] if "response_mask" in data.batch.keys() else \
            data.batch["attention_mask"][:, -response_length:]
        return values * mask.to(values.dtype)

    def _optimizer_step(self) -> float:
        max_norm = cfg_get(self.config, "grad_clip", None)
        if max_norm is None:
            max_norm = cfg_get(self.config, "optim.clip_grad", None)
        grad_norm = clip_grad_norm_(self.critic_module.parameters(), max_norm)
        if torch.isfinite(torch.tensor(grad_norm)):
            self.critic_optimizer.step()
        else:
            logger.warning("critic: non-finite grad norm %s, skipping this optimizer step", grad_norm)
        self.critic_optimizer.zero_grad(set_to_none=True)
        return grad_norm

    def update_critic(self, data: DataProto) -> dict:
        if self.critic_optimizer is None:
            raise RuntimeError("update_critic needs an optimizer: build DataParallelPPOCritic with critic_optimizer")
        cfg = self.config
        self.critic_module.train()
        loss_agg_mode = cfg_get(cfg, "loss_agg_mode", "token-mean")
        cliprange_value = float(cfg_get(cfg, "cliprange_value", 0.5))
        use_dynamic_bsz = bool(cfg_get(cfg, "use_dynamic_bsz", False))
        micro_bsz = cfg_get(cfg, "ppo_micro_batch_size_per_gpu", None)
        max_token_len = cfg_get(cfg, "ppo_max_token_len_per_gpu", None)
        mini_bsz = int(cfg_get(cfg, "ppo_mini_batch_size", len(data)))
        world = dp_world_size(self.dp_group)
        if "response_mask" not in data.batch.keys():
            data.batch["response_mask"] = data.batch["attention_mask"][:, -data.batch["responses"].shape[-1]:]
        keys = ["input_ids", "responses", "response_mask", "attention_mask", "position_ids", "values", "returns"]
        data = DataProto(batch=data.batch.select(*keys), meta_info=dict(data.meta_info))

        metrics = defaultdict(list)
        per_token = loss_agg_mode == "token-mean"
        for epoch in range(int(cfg_get(cfg, "ppo_epochs", 1))):
            epoch_data = data
            if cfg_get(cfg, "shuffle", False):
                gen = torch.Generator().manual_seed(int(cfg_get(cfg, "data_loader_seed", 42)) + epoch)
                epoch_data = data.select_idxs(torch.randperm(len(data), generator=gen).numpy())
            for mini_batch in epoch_data.split(mini_bsz):
                total = global_count(mini_batch.batch["response_mask"], per_token, self.dp_group)
                micro_batches, _ = make_micro_batches(mini_batch.batch, micro_bsz, use_dynamic_bsz, max_token_len,
                                                      self.dp_group)
                self.critic_optimizer.zero_grad(set_to_none=True)
                device = module_device(self.critic_module)
                for micro in micro_batches:
                    micro = micro.to(device)
                    mask = micro["response_mask"]
                    vpreds = self._forward_micro_batch(micro)
                    vf_loss, vf_clipfrac = compute_value_loss(
                        vpreds=vpreds, returns=micro["returns"], values=micro["values"], response_mask=mask,
                        cliprange_value=cliprange_value, loss_agg_mode=loss_agg_mode,
                    )
                    share = (mask.sum().item() if per_token else mask.shape[0]) / max(total, 1.0)
                    (vf_loss * (share * world)).backward()
                    metrics["critic/vf_loss"].append(_item(vf_loss))
                    metrics["critic/vf_clipfrac"].append(_item(vf_clipfrac))
                    metrics["critic/vpred_mean"].append(_item(masked_mean(vpreds, mask)))
                metrics["critic/grad_norm"].append(self._optimizer_step())
        return dict(metrics)
