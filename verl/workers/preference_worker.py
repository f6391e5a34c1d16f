"""Worker roles for recipes whose update is "a loss on the training engine" (DPO family, RM training, ...).

``PreferenceWorker`` is ``ActorRolloutRefWorker`` (same roles, config keys, rollout, hybrid-engine weight push,
reference policy and checkpoints) plus three methods a driver calls over a worker group:

- ``update_with_loss(loss_fn, data)``: one ``TrainEngine.train_batch`` of the actor with the driver's loss
  function (see ``verl.workers.engine.base``: ``loss_fn(outputs, micro_batch, ctx) -> (loss, metrics)``); the
  ``TrainSpec`` travels in ``data.meta_info["train_spec"]``. Metrics come back averaged over micro-batches.
- ``compute_seq_logps(data)`` / ``compute_ref_seq_logps(data)``: per-row sequence log-probs of the responses
  under the actor / the reference policy (``logps`` / ``ref_logps``; ``meta_info["average"]`` for the mean;
  ``meta_info["share_prompt"]`` computes interleaved pairs as packed ``[prompt | chosen | rejected]`` rows).
- ``shared_prompt_support()``: None when the actor's (and reference's) engine computes packed pairs exactly,
  otherwise why not; a driver asks once and sets ``TrainSpec.shared_prompt`` / ``share_prompt`` accordingly.
- ``compute_token_outputs(data)``: per-token engine outputs (``log_probs``, full ``logits``) of the responses
  under the reference model (a distillation teacher on a ``ref`` worker) or the actor.
- ``save_hf_model(out_dir)``: the actor as a Hugging Face directory.
- ``sync_ref_from_actor()``: the reference policy takes the actor's current weights (iterated methods whose
  reference is the previous iterate: SPIN, SPPO).

``RewardTrainerWorker`` trains a sequence classifier (engine ``model_kind="reward"``, a fresh scalar head on
the ``actor_rollout_ref.model.path`` body, optimizer from ``actor_rollout_ref.actor.optim``):
``update_with_loss``, ``compute_scores`` (``rm_scores``: the head at the last valid token),
``save_hf_model`` (a directory ``main_ppo`` loads with ``reward_model.enable=True``) and checkpoints.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

from verl.protocol import DataProto
from verl.single_controller.base import Worker
from verl.single_controller.base.decorator import Dispatch, register
from verl.trainer.preference.pairs import last_token_scores, sequence_logps
from verl.utils.model import check_model_dir
from verl.workers.actor.dp_actor import typed_actor_config
from verl.workers.config_utils import read_only_config
from verl.workers.engine import MicroBatchSpec, TrainEngine, TrainSpec, get_engine_cls
from verl.workers.engine.config import actor_engine_config, typed_section
from verl.workers.engine_workers import ActorRolloutRefWorker
from verl.workers.worker_utils import EngineCheckpointMixin, build_device_mesh, init_distributed, load_tokenizer

__all__ = ["PreferenceWorker", "RewardTrainerWorker", "mean_metrics"]


def mean_metrics(metrics: dict[str, list[float]]) -> dict[str, float]:
    """Per-micro-batch metric lists -> means (equal micro-batches: the mini-batch mean)."""
    return {k: float(sum(v) / len(v)) for k, v in metrics.items() if len(v)}


def _train_spec(data: DataProto) -> TrainSpec:
    spec = data.meta_info.get("train_spec")
    if not isinstance(spec, TrainSpec):
        raise ValueError("update_with_loss needs data.meta_info['train_spec'] (a TrainSpec); "
                         "build one with verl.trainer.preference.pair_train_spec")
    return spec


class PreferenceWorker(ActorRolloutRefWorker):
    """The policy roles of ``ActorRolloutRefWorker`` with a loss-function update; see the module docstring."""

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO_WITH_FUNC)
    def update_with_loss(self, loss_fn: Callable, data: DataProto) -> DataProto:
        engine = self._require_actor("update_with_loss")
        start = time.perf_counter()
        metrics = mean_metrics(engine.train_batch(data, loss_fn, _train_spec(data)))
        metrics["actor/lr"] = engine.lr_scheduler_step()
        metrics["perf/update_actor_s"] = time.perf_counter() - start
        self._weights_changed()
        return DataProto(meta_info={"metrics": metrics})

    def _seq_logps(self, engine: TrainEngine, data: DataProto, section: str) -> torch.Tensor:
        spec = self._log_prob_micro.get(section) or MicroBatchSpec(micro_batch_size=len(data))
        temperature = float(data.meta_info.get("temperature", 1.0))
        shared = bool(data.meta_info.get("share_prompt", False))
        if shared and (spec.use_dynamic_bsz or (spec.micro_batch_size or 2) % 2):
            # packed pairs need whole pairs per micro-batch: the largest even row count within the configured size
            spec = MicroBatchSpec(micro_batch_size=max(2, (spec.micro_batch_size or len(data)) // 2 * 2))
        token = engine.infer(data, ("log_probs",), spec, temperature, shared_prompt=shared)["log_probs"]
        return sequence_logps(token, data.batch["response_mask"].float(), bool(data.meta_info.get("average", False)))

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def shared_prompt_support(self) -> str | None:
        """None when pairs can be computed as packed rows sharing their prompt (actor and reference)."""
        engines = [self._require_actor("shared_prompt_support")]
        if self._is_ref and not self._ref_in_actor and self.ref_engine is not None:
            engines.append(self.ref_engine)
        for engine in engines:
            reason = engine.shared_prompt_unsupported()
            if reason is not None:
                return reason
        return None

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_seq_logps(self, data: DataProto) -> DataProto:
        """``logps`` (B,): the actor's log-prob of each row's response (sum, or mean with meta ``average``)."""
        engine = self._require_actor("compute_seq_logps")
        return DataProto.from_dict({"logps": self._seq_logps(engine, data, "rollout")})

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_ref_seq_logps(self, data: DataProto) -> DataProto:
        """``ref_logps`` (B,): the reference policy's log-prob of each response (LoRA: adapters off)."""
        if not self._is_ref:
            raise RuntimeError(f"compute_ref_seq_logps needs a ref role; this worker has role={self.role!r}")
        if self._ref_in_actor:
            with self.actor_engine.disable_adapter():
                return DataProto.from_dict({"ref_logps": self._seq_logps(self.actor_engine, data, "ref")})
        return DataProto.from_dict({"ref_logps": self._seq_logps(self.ref_engine, data, "ref")})

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_token_outputs(self, data: DataProto) -> DataProto:
        """Per-token outputs of the responses named by ``meta_info["outputs"]`` (engine outputs, e.g.
        ``log_probs`` (B, R) or ``logits`` (B, R, V)) under the reference model of a ``ref`` worker (a
        distillation teacher) or else the actor; keys are the output names. ``meta_info["temperature"]``
        divides the logits (default 1)."""
        outputs = tuple(data.meta_info.get("outputs") or ("log_probs",))
        engine, section = (self.ref_engine, "ref") if self.ref_engine is not None else (
            self._require_actor("compute_token_outputs"), "rollout")
        spec = self._log_prob_micro.get(section) or MicroBatchSpec(micro_batch_size=len(data))
        out = engine.infer(data, outputs, spec, float(data.meta_info.get("temperature", 1.0)))
        return DataProto.from_dict({name: out[name] for name in outputs})

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_hf_model(self, out_dir: str):
        return self._require_actor("save_hf_model").save_hf_model(out_dir, self.tokenizer)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def sync_ref_from_actor(self) -> int:
        """Copy the actor's parameters into the reference engine, shard by shard (both are built from the same
        model on the same device mesh, so each rank holds matching shards). Returns the number of tensors."""
        actor = self._require_actor("sync_ref_from_actor")
        if self.ref_engine is None:
            raise RuntimeError("sync_ref_from_actor needs a separate reference model (role actor_rollout_ref "
                               "without LoRA; a LoRA reference is the actor with its adapters off)")
        if not hasattr(actor, "module") or not hasattr(self.ref_engine, "module"):
            raise RuntimeError("sync_ref_from_actor supports FSDP engines (actor.strategy=fsdp/fsdp2)")
        ref_params = dict(self.ref_engine.module.named_parameters())
        actor.onload()
        self.ref_engine.onload()
        copied = 0
        try:
            with torch.no_grad():
                for name, param in actor.module.named_parameters():
                    target = ref_params.get(name)
                    src = param.to_local() if hasattr(param, "to_local") else param.data
                    dst = target.to_local() if hasattr(target, "to_local") else getattr(target, "data", None)
                    if dst is None or dst.shape != src.shape:
                        raise RuntimeError(f"sync_ref_from_actor: the reference has no parameter {name!r} shaped "
                                           f"like the actor's {tuple(src.shape)}; both must be the same model")
                    dst.copy_(src)
                    copied += 1
        finally:
            actor.offload()
            self.ref_engine.offload()
        return copied


class RewardTrainerWorker(EngineCheckpointMixin, Worker):
    """A trainable sequence classifier (reward model) on the training engine; see the module docstring."""

    def __init__(self, config, **kwargs):
        super().__init__()
        self.config = read_only_config(config)
        init_distributed()
        self.dp_size = dist.get_world_size()
        self.engine: TrainEngine | None = None
        self.tokenizer = None

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self):
        model = typed_section(self.config.get("model"), "actor_rollout_ref.model")
        actor = typed_actor_config(self.config.get("actor"))
        engine_config = dataclasses.replace(actor_engine_config({"model": model, "actor": actor}), model_kind="reward",
                                            name="reward_model")
        model_path = check_model_dir(engine_config.model_path)
        self.tokenizer = load_tokenizer(model.tokenizer_path or model_path, engine_config.trust_remote_code)
        self.engine = get_engine_cls(engine_config.strategy).build(
            engine_config, build_device_mesh(self.dp_size, actor.fsdp_config.fsdp_size), tokenizer=self.tokenizer)

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO_WITH_FUNC)
    def update_with_loss(self, loss_fn: Callable, data: DataProto) -> DataProto:
        start = time.perf_counter()
        metrics = mean_metrics(self.engine.train_batch(data, loss_fn, _train_spec(data)))
        metrics["rm/lr"] = self.engine.lr_scheduler_step()
        metrics["perf/update_rm_s"] = time.perf_counter() - start
        return DataProto(meta_info={"metrics": metrics})

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_scores(self, data: DataProto) -> DataProto:
        """``rm_scores`` (B,): the head's output at each row's last valid token."""
        micro = MicroBatchSpec(micro_batch_size=int(data.meta_info.get("micro_batch_size") or len(data)))
        scores = self.engine.infer(data, ("scores",), micro)["scores"]
        return DataProto.from_dict({"rm_scores": last_token_scores(scores, data.batch["attention_mask"])})

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_hf_model(self, out_dir: str):
        return self.engine.save_hf_model(out_dir, self.tokenizer)
