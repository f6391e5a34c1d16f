"""Data-parallel PPO actor on an FSDP2-sharded (or plain) Hugging Face causal LM.

Features and how to turn them on (keys of ``actor_rollout_ref.actor``; ``ref`` reads the log-prob keys):

- micro-batches: ``ppo_micro_batch_size_per_gpu`` (updates), ``log_prob_micro_batch_size_per_gpu`` or
  ``data.meta_info["micro_batch_size"]`` (scoring);
- dynamic batch size: ``use_dynamic_bsz`` with ``ppo_max_token_len_per_gpu`` / ``log_prob_max_token_len_per_gpu``
  (or ``meta_info["max_token_len"]``): micro-batches packed by token budget, same count on every rank;
- remove padding: ``use_remove_padding`` (falls back to the model config's ``use_remove_padding``): with a
  flash-attention model the valid tokens of a micro-batch are packed into one row (attention kept per sequence
  via packed ``position_ids``); under sdpa/eager (CPU) the all-padding columns are trimmed instead, because a
  packed row there costs O(total_tokens^2) attention (``verl.utils.padding.remove_padding_mode``);
- policy loss: ``policy_loss.loss_mode`` from the core_algos registry, aggregated by ``loss_agg_mode``;
- entropy bonus ``entropy_coeff``; KL loss to the reference policy ``use_kl_loss``, ``kl_loss_coef``,
  ``kl_loss_type`` (needs ``ref_log_prob`` in the batch);
- truncated importance sampling against the rollout engine: ``tis_imp_ratio_cap`` > 0 with
  ``rollout_log_probs`` in the batch (off by default), or precomputed ``rollout_is_weights`` in the batch;
- ``ppo_epochs``, ``shuffle`` (with ``data_loader_seed``), gradient clipping ``grad_clip`` (or ``optim.clip_grad``);
- bypass mode (``algorithm.rollout_correction.bypass_mode``; the trainer sets ``meta_info["bypass_mode"]`` and
  has put the rollout's log-probs in ``old_log_probs``): the rows of the first mini-batch of the first epoch are
  scored before any optimizer step, so their log-probs and entropies are the trainer's current ones.
  ``update_policy`` keeps them in ``last_on_policy`` (``on_policy_log_probs``, ``on_policy_entropys``,
  ``on_policy_rows``) in the input's row order; the trainer turns them into ``training/rollout_probs_diff_*``
  and ``actor/entropy`` without a separate log-prob pass.

Batch sizes are per rank: the worker has already turned ``ppo_mini_batch_size`` (prompts, global) into rows
per rank (``* rollout_n // dp_size``), as verl's workers do.

Gradient accumulation: each micro-batch loss is weighted by its share of the *global* mini-batch (tokens for
``token-mean``, sequences for the ``seq-mean-*`` modes, counted over all data-parallel ranks) times the dp size
(FSDP averages gradients over ranks). The update is then exactly the loss over the whole global mini-batch,
independent of how it is cut into micro-batches and ranks.
"""

from __future__ import annotations

import logging
from collections import defaultdict

import torch
import torch.distributed as dist
from torch import nn

from verl.protocol import DataProto
from verl.trainer.ppo.core_algos import agg_loss, get_policy_loss_fn, kl_penalty
from verl.trainer.ppo.rollout_corr import truncated_is_weights
from verl.utils.fsdp_utils import cfg_get, clip_grad_norm_
from verl.utils.device import module_device
from verl.utils.padding import (pack_batch, place_response_window, remove_padding_mode, response_window,
                                unpack_to_padded, valid_column_span)
from verl.utils.seqlen_balancing import global_count, make_micro_batches, restore_dynamic_batch
from verl.utils.torch_functional import entropy_from_logits, logprobs_from_logits
from verl.workers.actor.base import BasePPOActor

logger = logging.getLogger(__name__)

__all__ = ["DataParallelPPOActor"]


def _item(x) -> float:
    return float(x.detach().item()) if isinstance(x, torch.Tensor) else float(x)


def default_dp_group():
    """The group FSDP averages gradients over: all ranks when torch.distributed is up, else None."""
    return dist.group.WORLD if dist.is_available() and dist.is_initialized() else None


def dp_world_size(group) -> int:
    return dist.get_world_size(group) if group is not None else 1


def _entropy(logits: torch.Tensor, with_grad: bool) -> torch.Tensor:
    if not with_grad:
        logits = logits.detach()
    return entropy_from_logits(logits if logits.dtype == torch.float32 else logits.float())


def forward_log_probs(module: nn.Module, micro_batch, temperature: float = 1.0, calculate_entropy: bool = False,
                      use_remove_padding: bool = False, entropy_grad: bool = True):
    """Log-probs (and entropies) of the response tokens of one micro-batch: returns ``(entropy, log_probs)``.

    ``micro_batch`` holds ``input_ids``, ``attention_mask``, ``position_ids`` (B, T) and ``responses`` (B, R);
    the response occupies the last R columns. Logits are divided by ``temperature`` before the softmax.
    ``entropy_grad=False`` computes the entropy from detached logits (a metric only: no graph is kept for it).
    """
    input_ids = micro_batch["input_ids"]
    attention_mask = micro_batch["attention_mask"]
    position_ids = micro_batch["position_ids"]
    response_length = micro_batch["responses"].shape[-1]
    batch, seqlen = input_ids.shape
    entropy = None
    mode = remove_padding_mode(module) if use_remove_padding else "padded"
    if mode == "pack":
        ids, pos, indices, _ = pack_batch(input_ids, attention_mask, position_ids)
        logits = module(input_ids=ids, attention_mask=None, position_ids=pos, use_cache=False).logits[0]
        logits = logits / temperature
        labels = torch.roll(ids[0], shifts=-1)  # token t+1 is the label of position t (wrap-around is masked)
        log_probs = unpack_to_padded(logprobs_from_logits(logits, labels), indices, batch, seqlen)
        log_probs = log_probs[:, -response_length - 1 : -1]
        if calculate_entropy:
            ent = _entropy(logits, entropy_grad)
            entropy = unpack_to_padded(ent, indices, batch, seqlen)[:, -response_length - 1 : -1]
    else:
        # "trim": compute only the columns that hold a valid token in some row; "padded": every column
        lo, hi = valid_column_span(attention_mask) if mode == "trim" else (0, seqlen)
        s, e = response_window(seqlen, response_length, lo, hi)
        output = module(input_ids=input_ids[:, lo:hi], attention_mask=attention_mask[:, lo:hi],
                        position_ids=position_ids[..., lo:hi], use_cache=False)
        logits = output.logits[:, s - lo : e - lo, :] / temperature
        first = s - (seqlen - response_length - 1)  # response column of position s
        log_probs = place_response_window(logprobs_from_logits(logits, input_ids[:, s + 1 : e + 1]),
                                          response_length, first)
        if calculate_entropy:
            ent = _entropy(logits, entropy_grad)
            entropy = place_response_window(ent, response_length, first)
    return entropy, log_probs.float()


class DataParallelPPOActor(BasePPOActor):
    """``compute_log_prob`` and ``update_policy`` for one data-parallel rank (see the module docstring)."""

    def __init__(self, config, actor_module: nn.Module, actor_optimizer: torch.optim.Optimizer | None = None,
                 dp_group=None):
        super().__init__(config)
        self.actor_module = actor_module
        self.actor_optimizer = actor_optimizer
        self.dp_group = dp_group if dp_group is not None else default_dp_group()
        self.use_remove_padding = bool(cfg_get(config, "use_remove_padding", False))
        self.last_on_policy: dict | None = None  # bypass mode: see update_policy

    # ------------------------------------------------------------------------------------------- scoring
    def _forward_micro_batch(self, micro_batch, temperature: float, calculate_entropy: bool = False,
                             entropy_grad: bool = True):
        return forward_log_probs(self.actor_module, micro_batch, temperature, calculate_entropy,
                                 self.use_remove_padding, entropy_grad)

    def compute_log_prob(self, data: DataProto, calculate_entropy: bool = False):
        """(log_probs (B, R), entropys (B, R) or None) under the current weights, no gradients."""
        cfg, meta = self.config, data.meta_info
        temperature = float(meta.get("temperature", 1.0))
        use_dynamic_bsz = meta.get("use_dynamic_bsz", None)
        if use_dynamic_bsz is None:
            use_dynamic_bsz = cfg_get(cfg, "log_prob_use_dynamic_bsz", cfg_get(cfg, "use_dynamic_bsz", False))
        micro_bsz = meta.get("micro_batch_size") or cfg_get(cfg, "log_prob_micro_batch_size_per_gpu", None) or \
            cfg_get(cfg, "ppo_micro_batch_size_per_gpu", None)
        max_token_len = meta.get("max_token_len") or cfg_get(cfg, "log_prob_max_token_len_per_gpu", None) or \
            cfg_get(cfg, "ppo_max_token_len_per_gpu", None)

        batch = data.batch.select("responses", "input_ids", "attention_mask", "position_ids")
        micro_batches, partitions = make_micro_batches(batch, micro_bsz, bool(use_dynamic_bsz), max_token_len,
                                                       self.dp_group)
        log_probs, entropys = [], []
        device = module_device(self.actor_module)  # batches arrive on CPU; results go back there
        with torch.no_grad():
            for micro in micro_batches:
                entropy, lp = self._forward_micro_batch(micro.to(device), temperature, calculate_entropy)
                log_probs.append(lp.cpu())
                if calculate_entropy:
                    entropys.append(entropy.float().cpu())
        log_probs = torch.cat(log_probs, dim=0)
        entropys = torch.cat(entropys, dim=0) if calculate_entropy else None
        if partitions is not None:
            log_probs = restore_dynamic_batch(log_probs, partitions)
            entropys = restore_dynamic_batch(entropys, partitions) if entropys is not None else None
        return log_probs, entropys

    # ------------------------------------------------------------------------------------------- update
    def _mini_batches(self, data: DataProto, epoch: int) -> list[DataProto]:
        mini_bsz = int(cfg_get(self.config, "ppo_mini_batch_size", len(data)))
        if mini_bsz <= 0:
            raise ValueError(f"actor.ppo_mini_batch_size must be > 0 (rows per rank), got {mini_bsz}")
        if cfg_get(self.config, "shuffle", False):
            gen = torch.Generator().manual_seed(int(cfg_get(self.config, "data_loader_seed", 42)) + epoch)
            data = data.select_idxs(torch.randperm(len(data), generator=gen).numpy())
        return data.split(mini_bsz)

    def _optimizer_step(self) -> float:
        max_norm = cfg_get(self.config, "grad_clip", None)
        if max_norm is None:
            max_norm = cfg_get(self.config, "optim.clip_grad", None)
        grad_norm = clip_grad_norm_(self.actor_module.parameters(), max_norm)
        if torch.isfinite(torch.tensor(grad_norm)):
            self.actor_optimizer.step()
        else:
            logger.warning("actor: non-finite grad norm %s, skipping this optimizer step", grad_norm)
        self.actor_optimizer.zero_grad(set_to_none=True)
        return grad_norm

    def update_policy(self, data: DataProto) -> dict:
        """PPO update: ``ppo_epochs`` x mini-batches, each one optimizer step; returns metrics (lists)."""
        if self.actor_optimizer is None:
            raise RuntimeError("update_policy needs an optimizer: build DataParallelPPOActor with actor_optimizer")
        cfg = self.config
        self.actor_module.train()
        temperature = float(data.meta_info.get("temperature", 1.0))
        loss_agg_mode = cfg_get(cfg, "loss_agg_mode", "token-mean")
        policy_loss_fn = get_policy_loss_fn(cfg_get(cfg, "policy_loss.loss_mode", "vanilla"))
        entropy_coeff = float(cfg_get(cfg, "entropy_coeff", 0.0))
        use_kl_loss = bool(cfg_get(cfg, "use_kl_loss", False))
        kl_coef = float(cfg_get(cfg, "kl_loss_coef", 0.001))
        kl_type = cfg_get(cfg, "kl_loss_type", "low_var_kl")
        tis_cap = float(cfg_get(cfg, "tis_imp_ratio_cap", -1) or -1)
        calc_entropy = entropy_coeff != 0 or bool(cfg_get(cfg, "calculate_entropy", False))
        use_dynamic_bsz = bool(cfg_get(cfg, "use_dynamic_bsz", False))
        micro_bsz = cfg_get(cfg, "ppo_micro_batch_size_per_gpu", None)
        max_token_len = cfg_get(cfg, "ppo_max_token_len_per_gpu", None)
        world = dp_world_size(self.dp_group)

        if "response_mask" not in data.batch.keys():
            data.batch["response_mask"] = data.batch["attention_mask"][:, -data.batch["responses"].shape[-1]:]
        keys = ["responses", "response_mask", "input_ids", "attention_mask", "position_ids", "old_log_probs",
                "advantages"]
        if use_kl_loss:
            if "ref_log_prob" not in data.batch.keys():
                raise KeyError("actor.use_kl_loss=True needs 'ref_log_prob' in the batch (enable the reference policy)")
            keys.append("ref_log_prob")
        for optional in ("rollout_log_probs", "rollout_is_weights"):
            if optional in data.batch.keys():
                keys.append(optional)
        data = DataProto(batch=data.batch.select(*keys), meta_info=dict(data.meta_info))
        # bypass mode (old_log_probs are the rollout's): keep the trainer's log-probs and entropies of the rows
        # scored before the first optimizer step, for the sync metric and actor/entropy (see module docstring)
        capture = bool(data.meta_info.get("bypass_mode", False))
        captured = None
        if capture:
            n_rows, resp_len = data.batch["responses"].shape
            data.batch["_row"] = torch.arange(n_rows)
            captured = {"on_policy_log_probs": torch.zeros(n_rows, resp_len),
                        "on_policy_entropys": torch.zeros(n_rows, resp_len),
                        "on_policy_rows": torch.zeros(n_rows, dtype=torch.bool)}
        self.last_on_policy = None

        metrics = defaultdict(list)
        for epoch in range(int(cfg_get(cfg, "ppo_epochs", 1))):
            for mb_index, mini_batch in enumerate(self._mini_batches(data, epoch)):
                capture_now = capture and epoch == 0 and mb_index == 0
                per_token = loss_agg_mode == "token-mean"
                total = global_count(mini_batch.batch["response_mask"], per_token, self.dp_group)
                micro_batches, _ = make_micro_batches(mini_batch.batch, micro_bsz, use_dynamic_bsz, max_token_len,
                                                      self.dp_group)
                self.actor_optimizer.zero_grad(set_to_none=True)
                device = module_device(self.actor_module)
                for micro in micro_batches:
                    micro = micro.to(device)
                    mask = micro["response_mask"]
                    entropy, log_prob = self._forward_micro_batch(micro, temperature, calc_entropy or capture_now,
                                                                  entropy_grad=entropy_coeff != 0)
                    if capture_now:
                        rows = micro["_row"].cpu()
                        captured["on_policy_log_probs"][rows] = log_prob.detach().float().cpu()
                        captured["on_policy_entropys"][rows] = entropy.detach().float().cpu()
                        captured["on_policy_rows"][rows] = True
                    old_log_prob = micro["old_log_probs"]
                    is_weights = None
                    if "rollout_is_weights" in micro.keys():
                        is_weights = micro["rollout_is_weights"]
                    elif tis_cap > 0 and "rollout_log_probs" in micro.keys():
                        is_weights, _ = truncated_is_weights(old_log_prob, micro["rollout_log_probs"], mask, "token",
                                                             tis_cap)
                    pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower = policy_loss_fn(
                        old_log_prob=old_log_prob, log_prob=log_prob, advantages=micro["advantages"],
                        response_mask=mask, loss_agg_mode=loss_agg_mode, config=cfg, rollout_is_weights=is_weights,
                    )
                    policy_loss = pg_loss
                    if calc_entropy:
                        entropy_agg = agg_loss(entropy, mask, loss_agg_mode)
                        metrics["actor/entropy"].append(entropy_agg.detach().item())
                        if entropy_coeff != 0:
                            policy_loss = policy_loss - entropy_coeff * entropy_agg
                    if use_kl_loss:
                        kld = kl_penalty(log_prob, micro["ref_log_prob"], kl_penalty=kl_type)
                        kl_loss = agg_loss(kld, mask, loss_agg_mode)
                        policy_loss = policy_loss + kl_coef * kl_loss
                        metrics["actor/kl_loss"].append(kl_loss.detach().item())
                        metrics["actor/kl_coef"].append(kl_coef)
                    share = (mask.sum().item() if per_token else mask.shape[0]) / max(total, 1.0)
                    (policy_loss * (share * world)).backward()
                    metrics["actor/pg_loss"].append(pg_loss.detach().item())
                    metrics["actor/pg_clipfrac"].append(_item(pg_clipfrac))
                    metrics["actor/ppo_kl"].append(_item(ppo_kl))
                    metrics["actor/pg_clipfrac_lower"].append(_item(pg_clipfrac_lower))
                metrics["actor/grad_norm"].append(self._optimizer_step())
        self.last_on_policy = captured
        return dict(metrics)
