"""The PPO actor: the policy loss, handed to a training engine (``verl.workers.engine``).

Features and how to turn them on (keys of ``actor_rollout_ref.actor``, read from the typed
``verl.workers.config.ActorConfig``; a Hydra section or dict is converted once, keys it leaves out take the
schema's defaults):

- micro-batches: ``ppo_micro_batch_size_per_gpu`` (updates); scoring takes ``data.meta_info["micro_batch_size"]``
  (the workers put ``rollout.log_prob_micro_batch_size_per_gpu`` / ``ref.log_prob_micro_batch_size_per_gpu``
  there), else ``ppo_micro_batch_size_per_gpu``;
- dynamic batch size: ``use_dynamic_bsz`` with ``ppo_max_token_len_per_gpu`` (scoring: ``meta_info["use_dynamic_bsz"]``
  / ``meta_info["max_token_len"]`` first): micro-batches packed by token budget, same count on every rank;
- remove padding: ``use_remove_padding`` (see ``verl.workers.engine.hf_forward``);
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
- router replay (``router_replay.mode=R2``, mixture-of-experts models on the Megatron engine): ``compute_log_prob``
  with ``record_routing=True`` also returns ``routed_experts``, every token's top-k experts per MoE layer at the
  columns of ``input_ids``, which the worker adds to the batch beside ``old_log_probs``; ``update_policy`` takes it
  into the mini-batches (it follows its rows through shuffling and re-cutting), and the engine computes each
  micro-batch with those experts, so the update's ratio compares log-probs of the same expert choices. With
  ``old_log_prob_source=update`` there is nothing to replay: the old log-probs come from the update's own forward,
  whose routing is the one they were computed with.
- old log-probs from the update's own forward (``actor.old_log_prob_source=update``; the trainer sets
  ``meta_info["old_log_probs_from_update"]``): with one mini-batch and one epoch the weights that scored the
  batch are the ones being updated, so ``old_log_probs`` is the update forward's ``log_probs`` detached -- the
  same numbers the trainer's separate pass would compute, one forward fewer. The batch carries no
  ``old_log_probs``; the first-forward scores are kept as in bypass mode, for the same metrics.

Batch sizes are per rank: ``ppo_mini_batch_size`` in ``config`` counts rows per rank (as in verl, whose workers
rewrite the key), unless the worker passes the derived ``batch_sizes`` (``verl.workers.config_utils``).
The engine weights each micro-batch loss by its share of the global mini-batch (tokens for ``token-mean``,
sequences for the ``seq-mean-*`` modes), so the update does not depend on how the batch is cut.
"""

from __future__ import annotations

import torch
from torch import nn

from verl.protocol import DataProto
from verl.trainer.ppo.core_algos import agg_loss, get_policy_loss_fn, kl_penalty
from verl.trainer.ppo.rollout_corr import reinforce_is_loss, truncated_is_weights
from verl.utils.dataset.vision_utils import MM_KEYS
from verl.utils.padding import response_mask
from verl.utils.torch_functional import CHECKPOINT_ENTROPY
from verl.workers.actor.base import BasePPOActor
from verl.workers.config import ActorConfig
from verl.workers.config.roles import typed_section
from verl.workers.config_utils import PPOBatchSizes
from verl.workers.engine import FSDPEngine, LossContext, MicroBatchSpec, TrainEngine, TrainSpec
from verl.workers.engine.hf_forward import forward_log_probs

ROUTED_EXPERTS = "routed_experts"  # router replay: see verl.models.mcore.router_replay

__all__ = ["DataParallelPPOActor", "forward_log_probs", "PolicyLoss", "typed_actor_config"]


def typed_actor_config(config) -> ActorConfig:
    """``config`` (the ``actor_rollout_ref.actor`` or ``.ref`` section: a Hydra node, a dict or None) as the typed
    actor config of its strategy (``FSDPActorConfig`` / ``McoreActorConfig``); a typed one is returned as it is."""
    return typed_section(config, "actor_rollout_ref.actor")


class PolicyLoss:
    """The PPO-family actor loss for one micro-batch: policy loss (registry) - entropy bonus + KL penalty.

    Called by the engine as ``loss(outputs, micro_batch, ctx)``. With ``capture`` (bypass mode) the
    log-probs and entropies of the first mini-batch of the first epoch are kept, by original row (``_row``).
    """

    def __init__(self, cfg, n_rows: int = 0, response_length: int = 0, capture: bool = False,
                 old_from_update: bool = False, bypass_reinforce: dict | None = None):
        self.cfg = cfg = typed_actor_config(cfg)
        self.old_from_update = old_from_update
        self.bypass_reinforce = bypass_reinforce  # loss_type=reinforce in bypass mode (rollout_corr.py)
        self.loss_agg_mode = cfg.loss_agg_mode
        self.policy_loss_fn = get_policy_loss_fn(cfg.policy_loss.loss_mode)
        self.entropy_coeff = float(cfg.entropy_coeff)
        self.use_kl_loss = bool(cfg.use_kl_loss)
        self.kl_coef = float(cfg.kl_loss_coef)
        self.kl_type = cfg.kl_loss_type
        self.tis_cap = float(cfg.tis_imp_ratio_cap or -1)  # null or -1: off
        self.calc_entropy = self.entropy_coeff != 0 or bool(cfg.calculate_entropy)
        self.captured = None
        if capture:
            self.captured = {"on_policy_log_probs": torch.zeros(n_rows, response_length),
                             "on_policy_entropys": torch.zeros(n_rows, response_length),
                             "on_policy_rows": torch.zeros(n_rows, dtype=torch.bool)}

    @property
    def outputs(self) -> tuple[str, ...]:
        return ("log_probs", "entropy") if (self.calc_entropy or self.captured is not None) else ("log_probs",)

    def _capture(self, outputs: dict, micro) -> None:
        rows = micro["_row"].cpu()
        self.captured["on_policy_log_probs"][rows] = outputs["log_probs"].detach().float().cpu()
        self.captured["on_policy_entropys"][rows] = outputs["entropy"].detach().float().cpu()
        self.captured["on_policy_rows"][rows] = True

    def __call__(self, outputs: dict, micro, ctx: LossContext):
        log_prob, mask, mode = outputs["log_probs"], micro["response_mask"], self.loss_agg_mode
        if self.captured is not None and ctx.epoch == 0 and ctx.mini_batch == 0:
            self._capture(outputs, micro)
        old_log_prob = log_prob.detach() if self.old_from_update else micro["old_log_probs"]
        is_weights = None
        if "rollout_is_weights" in micro.keys():
            is_weights = micro["rollout_is_weights"]
        elif self.tis_cap > 0 and "rollout_log_probs" in micro.keys():
            is_weights, _ = truncated_is_weights(old_log_prob, micro["rollout_log_probs"], mask, "token", self.tis_cap)
        metrics = {}
        if self.bypass_reinforce is not None:
            r = self.bypass_reinforce
            pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower = reinforce_is_loss(
                log_prob, old_log_prob, micro["advantages"], mask, mode, r["rollout_is"], r["rollout_is_threshold"],
                r["rollout_is_batch_normalize"], metrics=metrics)
        else:
            pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower = self.policy_loss_fn(
                old_log_prob=old_log_prob, log_prob=log_prob, advantages=micro["advantages"], response_mask=mask,
                loss_agg_mode=mode, config=self.cfg, rollout_is_weights=is_weights,
            )
        loss = pg_loss
        if self.calc_entropy:
            entropy = agg_loss(outputs["entropy"], mask, mode)
            metrics["actor/entropy"] = entropy
            if self.entropy_coeff != 0:
                loss = loss - self.entropy_coeff * entropy
        if self.use_kl_loss:
            kl = agg_loss(kl_penalty(log_prob, micro["ref_log_prob"], kl_penalty=self.kl_type), mask, mode)
            loss = loss + self.kl_coef * kl
            metrics["actor/kl_loss"] = kl
            metrics["actor/kl_coef"] = self.kl_coef
        metrics.update({"actor/pg_loss": pg_loss, "actor/pg_clipfrac": pg_clipfrac, "actor/ppo_kl": ppo_kl,
                        "actor/pg_clipfrac_lower": pg_clipfrac_lower})
        return loss, metrics


class DataParallelPPOActor(BasePPOActor):
    """``compute_log_prob`` and ``update_policy`` for one data-parallel rank (see the module docstring).

    Give it an ``engine`` (what the workers do), or, as in verl, a model and optimizer: they are then wrapped in
    an :class:`~verl.workers.engine.FSDPEngine`.
    """

    def __init__(self, config, actor_module: nn.Module | None = None,
                 actor_optimizer: torch.optim.Optimizer | None = None, dp_group=None, *,
                 engine: TrainEngine | None = None, batch_sizes: PPOBatchSizes | None = None):
        config = typed_actor_config(config)
        super().__init__(config)
        if engine is None:
            if actor_module is None:
                raise ValueError("DataParallelPPOActor needs an engine or an actor_module")
            grad_clip = config.grad_clip if config.grad_clip is not None else config.optim.clip_grad
            engine = FSDPEngine(actor_module, actor_optimizer, dp_group=dp_group,
                                use_remove_padding=config.use_remove_padding, grad_clip=grad_clip, name="actor")
        self.engine = engine
        self.batch_sizes = batch_sizes
        self.last_on_policy: dict | None = None  # bypass mode: see update_policy

    @property
    def actor_module(self) -> nn.Module | None:
        return getattr(self.engine, "module", None)

    # ------------------------------------------------------------------------------------------- scoring
    def compute_log_prob(self, data: DataProto, calculate_entropy: bool = False, record_routing: bool = False):
        """(log_probs (B, R), entropys (B, R) or None) under the current weights, no gradients; with
        ``record_routing`` a third element: ``routed_experts`` (B, T, MoE layers, top-k) of this forward."""
        cfg, meta = self.config, data.meta_info
        use_dynamic_bsz = meta.get("use_dynamic_bsz", None)
        micro = MicroBatchSpec(
            micro_batch_size=meta.get("micro_batch_size") or cfg.ppo_micro_batch_size_per_gpu,
            use_dynamic_bsz=bool(cfg.use_dynamic_bsz if use_dynamic_bsz is None else use_dynamic_bsz),
            max_token_len=meta.get("max_token_len") or cfg.ppo_max_token_len_per_gpu)
        outputs = ("log_probs", "entropy") if calculate_entropy else ("log_probs",)
        if record_routing:
            outputs += (ROUTED_EXPERTS,)
        out = self.engine.infer(data, outputs, micro, temperature=float(meta.get("temperature", 1.0)))
        if record_routing:
            return out["log_probs"], out.get("entropy"), out[ROUTED_EXPERTS]
        return out["log_probs"], out.get("entropy")

    @property
    def replays_routing(self) -> bool:
        """``router_replay.mode=R2``: the update replays the routing its batch carries (``routed_experts``)."""
        return self.config.router_replay.mode == "R2"

    # ------------------------------------------------------------------------------------------- update
    def _entropy_grad(self, loss: PolicyLoss):
        """The entropy enters the loss only with entropy_coeff != 0; ``entropy_checkpointing`` recomputes it in
        backward (see ``entropy_for_loss``)."""
        if loss.entropy_coeff == 0:
            return False
        return CHECKPOINT_ENTROPY if self.config.entropy_checkpointing else True

    def _train_spec(self, n_rows: int, loss: PolicyLoss, temperature: float) -> TrainSpec:
        cfg = self.config
        sizes = self.batch_sizes
        mini = sizes.mini_batch_size if sizes else int(cfg.ppo_mini_batch_size)
        micro = sizes.micro_batch_size if sizes else cfg.ppo_micro_batch_size_per_gpu
        if mini <= 0:
            raise ValueError(f"actor.ppo_mini_batch_size must be > 0 (rows per rank), got {mini}")
        return TrainSpec(
            mini_batch_size=mini,
            micro=MicroBatchSpec(micro, cfg.use_dynamic_bsz, cfg.ppo_max_token_len_per_gpu),
            epochs=int(cfg.ppo_epochs), shuffle=cfg.shuffle, seed=int(cfg.data_loader_seed),
            weight_by="tokens" if loss.loss_agg_mode == "token-mean" else "sequences",
            outputs=loss.outputs, temperature=temperature, entropy_grad=self._entropy_grad(loss),
            grad_norm_key="actor/grad_norm",
        )

    def update_policy(self, data: DataProto) -> dict:
        """PPO update: ``ppo_epochs`` x mini-batches, each one optimizer step; returns metrics (lists)."""
        data.batch["response_mask"] = response_mask(data)
        use_kl_loss = self.config.use_kl_loss
        old_from_update = bool(data.meta_info.get("old_log_probs_from_update", False))
        keys = ["responses", "response_mask", "input_ids", "attention_mask", "position_ids", "advantages"]
        if not old_from_update:
            keys.append("old_log_probs")
        if use_kl_loss:
            if "ref_log_prob" not in data.batch.keys():
                raise KeyError("actor.use_kl_loss=True needs 'ref_log_prob' in the batch (enable the reference policy)")
            keys.append("ref_log_prob")
        keys += [k for k in ("rollout_log_probs", "rollout_is_weights", *MM_KEYS) if k in data.batch.keys()]
        if self.replays_routing and not old_from_update:
            if ROUTED_EXPERTS not in data.batch.keys():
                raise KeyError(f"actor.router_replay.mode=R2 replays the routing recorded with the old log-probs, but "
                               f"the batch has no '{ROUTED_EXPERTS}' (the actor's compute_log_prob records it; "
                               "bypass mode has no such pass)")
            keys.append(ROUTED_EXPERTS)
        batch = DataProto(batch=data.batch.select(*keys), meta_info=dict(data.meta_info))
        capture = bool(data.meta_info.get("bypass_mode", False)) or old_from_update
        n_rows, response_length = batch.batch["responses"].shape
        if capture:
            batch.batch["_row"] = torch.arange(n_rows)
        loss = PolicyLoss(self.config, n_rows, response_length, capture=capture, old_from_update=old_from_update,
                          bypass_reinforce=data.meta_info.get("bypass_reinforce", None))
        spec = self._train_spec(n_rows, loss, float(data.meta_info.get("temperature", 1.0)))
        if old_from_update and (spec.epochs != 1 or spec.mini_batch_size < n_rows):
            raise ValueError(
                f"actor.old_log_prob_source=update needs one update per batch (ppo_epochs=1 and one mini-batch), got "
                f"ppo_epochs={spec.epochs} and {n_rows} rows in mini-batches of {spec.mini_batch_size}; "
                "use actor.old_log_prob_source=trainer")
        self.last_on_policy = None
        metrics = self.engine.train_batch(batch, loss, spec)
        self.last_on_policy = loss.captured
        return metrics
