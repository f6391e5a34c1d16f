"""The PPO critic: the clipped value loss, handed to a training engine (``verl.workers.engine``).

Keys of ``critic``, read from the typed ``verl.workers.config.CriticConfig`` (a Hydra section or dict is
converted once; keys it leaves out take the schema's defaults): ``ppo_mini_batch_size`` (rows per rank unless the
worker passes the derived ``batch_sizes``), ``ppo_micro_batch_size_per_gpu``, ``forward_micro_batch_size_per_gpu``
(or ``meta_info["micro_batch_size"]``), ``use_dynamic_bsz`` with ``ppo_max_token_len_per_gpu`` /
``forward_max_token_len_per_gpu`` (or ``meta_info["max_token_len"]``), ``ppo_epochs``, ``shuffle``,
``cliprange_value``, ``loss_agg_mode``, ``grad_clip`` (or ``optim.clip_grad``), ``model.use_remove_padding``.
The engine weights micro-batch losses exactly like the actor's.
"""

from __future__ import annotations

import torch
from torch import nn

from verl.protocol import DataProto
from verl.trainer.ppo.core_algos import compute_value_loss
from verl.utils.padding import response_mask
from verl.utils.torch_functional import masked_mean
from verl.workers.config import CriticConfig
from verl.workers.config.roles import typed_section
from verl.workers.config_utils import PPOBatchSizes
from verl.workers.critic.base import BasePPOCritic
from verl.workers.engine import FSDPEngine, MicroBatchSpec, TrainEngine, TrainSpec
from verl.workers.engine.hf_forward import forward_values

__all__ = ["DataParallelPPOCritic", "forward_values", "ValueLoss", "typed_critic_config"]


def typed_critic_config(config) -> CriticConfig:
    """``config`` (the ``critic`` section: a Hydra node, a dict or None) as the typed critic config of its strategy
    (``FSDPCriticConfig`` / ``McoreCriticConfig``); a typed one is returned as it is."""
    return typed_section(config, "critic")


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
        config = typed_critic_config(config)
        super().__init__(config)
        if engine is None:
            if critic_module is None:
                raise ValueError("DataParallelPPOCritic needs an engine or a critic_module")
            grad_clip = config.grad_clip if config.grad_clip is not None else config.optim.clip_grad
            engine = FSDPEngine(critic_module, critic_optimizer, dp_group=dp_group,
                                use_remove_padding=config.model.use_remove_padding, grad_clip=grad_clip,
                                name="critic")
        self.engine = engine
        self.batch_sizes = batch_sizes

    @property
    def critic_module(self) -> nn.Module | None:
        return getattr(self.engine, "module", None)

    def compute_values(self, data: DataProto) -> torch.Tensor:
        cfg, meta = self.config, data.meta_info
        micro = MicroBatchSpec(
            micro_batch_size=meta.get("micro_batch_size") or cfg.forward_micro_batch_size_per_gpu
            or cfg.ppo_micro_batch_size_per_gpu,
            use_dynamic_bsz=bool(meta.get("use_dynamic_bsz", cfg.use_dynamic_bsz)),
            max_token_len=meta.get("max_token_len") or cfg.forward_max_token_len_per_gpu)
        values = self.engine.infer(data, ("values",), micro)["values"]
        return values * response_mask(data).to(values.dtype)

    def update_critic(self, data: DataProto) -> dict:
        cfg = self.config
        data.batch["response_mask"] = response_mask(data)
        keys = ["input_ids", "responses", "response_mask", "attention_mask", "position_ids", "values", "returns"]
        batch = DataProto(batch=data.batch.select(*keys), meta_info=dict(data.meta_info))
        loss_agg_mode = cfg.loss_agg_mode
        sizes = self.batch_sizes
        spec = TrainSpec(
            mini_batch_size=sizes.mini_batch_size if sizes else int(cfg.ppo_mini_batch_size),
            micro=MicroBatchSpec(sizes.micro_batch_size if sizes else cfg.ppo_micro_batch_size_per_gpu,
                                 cfg.use_dynamic_bsz, cfg.ppo_max_token_len_per_gpu),
            epochs=int(cfg.ppo_epochs), shuffle=cfg.shuffle, seed=int(cfg.data_loader_seed),
            weight_by="tokens" if loss_agg_mode == "token-mean" else "sequences",
            outputs=("values",), grad_norm_key="critic/grad_norm",
        )
        return self.engine.train_batch(batch, ValueLoss(float(cfg.cliprange_value), loss_agg_mode),
                                       spec)
