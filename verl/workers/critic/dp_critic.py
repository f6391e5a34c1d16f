"""The PPO critic: the clipped value loss, handed to a training engine (``verl.workers.engine``).

Keys of ``critic``: ``ppo_mini_batch_size`` (rows per rank unless the worker passes the derived
``batch_sizes``), ``ppo_micro_batch_size_per_gpu``, ``forward_micro_batch_size_per_gpu`` (or
``meta_info["micro_batch_size"]``), ``use_dynamic_bsz`` with ``ppo_max_token_len_per_gpu`` /
``forward_max_token_len_per_gpu`` (or ``meta_info["max_token_len"]``), ``ppo_epochs``, ``shuffle``,
``cliprange_value``, ``loss_agg_mode``, ``grad_clip`` (or ``optim.clip_grad``), ``model.use_remove_padding`` /
``use_remove_padding``. The engine weights micro-batch losses exactly like the actor's.
"""

from __future__ import annotations

import torch
from torch import nn

from verl.protocol import DataProto
from verl.trainer.ppo.core_algos import compute_value_loss
from verl.utils.config import cfg_get
from verl.utils.padding import response_mask
from verl.utils.torch_functional import masked_mean
from verl.workers.config_utils import PPOBatchSizes
from verl.workers.critic.base import BasePPOCritic
from verl.workers.engine import FSDPEngine, MicroBatchSpec, TrainEngine, TrainSpec
from verl.workers.engine.hf_forward import forward_values

__all__ = ["DataParallelPPOCritic", "forward_values", "ValueLoss"]


class ValueLoss:
    """Clipped value loss (PPO) for one micro-batch, called by the engine as ``loss(outputs, micro, ctx)``."""

    def __init__(self, cliprange_value: float, loss_agg_mode: str):
        self.cliprange_value = cliprange_value
        self.loss_agg_mode = loss_agg_mode

    def __call__(self, outputs: dict, micro, ctx):
        vpreds, mask = outputs["values"], micro["response_mask"]
        vf_loss, vf_clipfrac = compute_value_loss(vpreds=vpreds, returns=micro["returns"], values=micro["values"],
                                                  response_mask=mask, cliprange_value=self.cliprange_value,
                                                  loss_agg_mode=self.loss_agg_mode)
        return vf_loss, {"critic/vf_loss": vf_loss, "critic/vf_clipfrac": vf_clipfrac,
                         "critic/vpred_mean": masked_mean(vpreds, mask)}


class DataParallelPPOCritic(BasePPOCritic):
    """``compute_values`` and ``update_critic`` for one data-parallel rank (see the module docstring)."""

    def __init__(self, config, critic_module: nn.Module | None = None,
                 critic_optimizer: torch.optim.Optimizer | None = None, dp_group=None, *,
                 engine: TrainEngine | None = None, batch_sizes: PPOBatchSizes | None = None):
        super().__init__(config)
        if engine is None:
            if critic_module is None:
                raise ValueError("DataParallelPPOCritic needs an engine or a critic_module")
            remove_padding = cfg_get(config, "use_remove_padding", cfg_get(config, "model.use_remove_padding", False))
            engine = FSDPEngine(critic_module, critic_optimizer, dp_group=dp_group,
                                use_remove_padding=bool(remove_padding),
                                grad_clip=cfg_get(config, "grad_clip", cfg_get(config, "optim.clip_grad", None)),
                                name="critic")
        self.engine = engine
        self.batch_sizes = batch_sizes

    @property
    def critic_module(self) -> nn.Module | None:
        return getattr(self.engine, "module", None)

    def compute_values(self, data: DataProto) -> torch.Tensor:
        cfg, meta = self.config, data.meta_info
        micro = MicroBatchSpec(
            micro_batch_size=meta.get("micro_batch_size") or cfg_get(cfg, "forward_micro_batch_size_per_gpu", None)
            or cfg_get(cfg, "ppo_micro_batch_size_per_gpu", None),
            use_dynamic_bsz=bool(meta.get("use_dynamic_bsz", cfg_get(cfg, "use_dynamic_bsz", False))),
            max_token_len=meta.get("max_token_len") or cfg_get(cfg, "forward_max_token_len_per_gpu", None)
            or cfg_get(cfg, "ppo_max_token_len_per_gpu", None))
        values = self.engine.infer(data, ("values",), micro)["values"]
        return values * response_mask(data).to(values.dtype)

    def update_critic(self, data: DataProto) -> dict:
        cfg = self.config
        data.batch["response_mask"] = response_mask(data)
        keys = ["input_ids", "responses", "response_mask", "attention_mask", "position_ids", "values", "returns"]
        batch = DataProto(batch=data.batch.select(*keys), meta_info=dict(data.meta_info))
        loss_agg_mode = cfg_get(cfg, "loss_agg_mode", "token-mean")
        sizes = self.batch_sizes
        spec = TrainSpec(
            mini_batch_size=sizes.mini_batch_size if sizes else int(cfg_get(cfg, "ppo_mini_batch_size", len(data))),
            micro=MicroBatchSpec(sizes.micro_batch_size if sizes else cfg_get(cfg, "ppo_micro_batch_size_per_gpu"),
                                 bool(cfg_get(cfg, "use_dynamic_bsz", False)),
                                 cfg_get(cfg, "ppo_max_token_len_per_gpu", None)),
            epochs=int(cfg_get(cfg, "ppo_epochs", 1)), shuffle=bool(cfg_get(cfg, "shuffle", False)),
            seed=int(cfg_get(cfg, "data_loader_seed", 42)),
            weight_by="tokens" if loss_agg_mode == "token-mean" else "sequences",
            outputs=("values",), grad_norm_key="critic/grad_norm",
        )
        return self.engine.train_batch(batch, ValueLoss(float(cfg_get(cfg, "cliprange_value", 0.5)), loss_agg_mode),
                                       spec)
