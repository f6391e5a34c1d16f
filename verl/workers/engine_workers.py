"""The role workers a PPO/GRPO driver calls through Ray worker groups, on the training-engine interface: the same
classes run every engine (FSDP2 here; ``verl.workers.megatron_workers`` subclasses them for Megatron's process
layout; a registered engine runs in them too). ``verl.workers.fsdp_workers`` names the same classes.

``ActorRolloutRefWorker(config=<actor_rollout_ref subtree>, role=...)``, one process per device, roles:

=====================  ===========================================================================
``actor``              the policy engine (model, optimizer, lr scheduler): ``compute_log_prob``, ``update_actor``
``rollout``            a rollout engine only (weights from ``model.path``): ``generate_sequences``
``ref``                a frozen engine copy of the initial policy: ``compute_ref_log_prob``
``actor_rollout``      the hybrid engine: actor + rollout engine in one process; before generating, the
                       sharding manager streams the actor's new weights into the engine
``actor_rollout_ref``  the same plus the reference policy (with LoRA: the actor with adapters disabled)
=====================  ===========================================================================

Every trainable or scoring model lives in a training engine (``verl.workers.engine``: model, optimizer, LR
schedule, sharding, micro-batching, checkpoints, the full-weight stream for the rollout push); the roles hand
it their losses (``verl.workers.actor.dp_actor.PolicyLoss``, ``verl.workers.critic.dp_critic.ValueLoss``).
This module only wires engines, rollout engines (``verl.workers.rollout``) and the hybrid-engine weight push
together per role, derives per-device batch sizes once (``config_utils``) and reports metrics. A worker never
changes the config it was given: it keeps a resolved, read-only copy.

``CriticWorker(config=<critic subtree>)`` (``compute_values``, ``update_critic``) and
``RewardModelWorker(config=<reward_model subtree>)`` (``compute_rm_score``, from
``verl.workers.reward_model_worker``) complete verl's set.

On CPU every process uses gloo and the thread share its worker group gave it (``VERL_NUM_THREADS``).
"""

from __future__ import annotations

import logging
import time
from contextlib import nullcontext
from typing import Any

import torch.distributed as dist

from verl.protocol import DataProto
from verl.single_controller.base import Worker
from verl.single_controller.base.decorator import Dispatch, make_nd_compute_dataproto_dispatch_fn, register
from verl.utils.device import get_device_name
from verl.utils.import_utils import import_user_modules, load_class
from verl.utils.model import check_model_dir, get_generation_config
from verl.utils.profiler import DistProfiler, DistProfilerExtension
from verl.utils.rollout_trace import trainer_run_names
from verl.workers.actor.dp_actor import DataParallelPPOActor
from verl.workers.config.critic import CriticConfig
from verl.workers.config.roles import ActorRolloutRefSections, actor_rollout_ref_sections, critic_sections
from verl.workers.config.rollout import as_rollout_config
from verl.workers.config_utils import (log_prob_micro_size, memory_metrics, per_device_micro_size, ppo_batch_sizes,
                                       read_only_config)
from verl.workers.critic.dp_critic import DataParallelPPOCritic
from verl.workers.engine import (MicroBatchSpec, TrainEngine, get_engine_cls)
from verl.workers.engine.config import (EngineConfig, actor_engine_config, critic_engine_config,
                                        local_model_path, ref_engine_config)
from verl.workers.rollout import get_rollout_class
from verl.workers.rollout.engine_group import EngineGroupLeader, EngineRound, follow_engine_leader, new_engine_groups
from verl.workers.rollout.layout import RolloutLayout, check_rollout_parallel, rollout_layout
from verl.workers.rollout.utils import resolve_special_tokens
from verl.workers.sharding_manager import FSDPRolloutShardingManager
from verl.workers.sharding_manager.fsdp_rollout import iter_base_tensors, iter_lora_adapter_tensors
from verl.workers.reward_model_worker import RewardModelWorker
from verl.workers.worker_utils import (EngineCheckpointMixin, build_device_mesh, init_distributed, load_tokenizer,
                                       max_across_ranks, min_across_ranks)

__all__ = ["ActorRolloutRefWorker", "AsyncActorRolloutRefWorker", "CriticWorker", "RewardModelWorker",
           "push_bucket_bytes"]

logger = logging.getLogger(__name__)

# rollout.mode=async: verl's agent loop runs the episodes (named, not imported: it sits in a higher layer)
AGENT_LOOP = "verl.experimental.agent_loop:AgentLoopWorker"
_ROLES = ("actor", "rollout", "ref", "actor_rollout", "actor_rollout_ref")
# training-engine calls follow the data-parallel rank: with Ulysses sequence parallel (sp > 1) the sp ranks of one
# group get the same rows and the first of them returns the group's result (sp = 1: one chunk per rank, as ever)
_ACTOR_DP = make_nd_compute_dataproto_dispatch_fn("actor")
_CRITIC_DP = make_nd_compute_dataproto_dispatch_fn("critic")
# generation follows the rollout layout: prompts split over the engines (rollout data-parallel ranks); the
# rollout.tensor_model_parallel_size ranks of one engine get the same prompts and tensor rank 0 returns the result
_ROLLOUT_DP = make_nd_compute_dataproto_dispatch_fn("rollout")


def _register_sp_dispatch(worker: Worker, mesh: str, role_cfg) -> int:
    """Declare this rank's dp rank for ``mesh`` from ``<role>.ulysses_sequence_parallel_size`` (``role_cfg`` is the
    typed role config); returns the dp size."""
    sp = int(role_cfg.ulysses_sequence_parallel_size)
    world, rank = dist.get_world_size(), dist.get_rank()
    if world % sp:
        raise ValueError(f"ulysses_sequence_parallel_size={sp} must divide the number of processes ({world})")
    worker._register_dispatch_collect_info(mesh, dp_rank=rank // sp, is_collect=rank % sp == 0)
    return world // sp


def _has_images(prompts: DataProto) -> bool:
    data = prompts.non_tensor_batch.get("multi_modal_data")
    return data is not None and any(isinstance(d, dict) and d.get("image") for d in data)


# ------------------------------------------------------------------------------------ actor/rollout/ref

def push_bucket_bytes(rollout_cfg) -> int:
    """Bytes of the actor's weights gathered per collective for a weight push: 0 (one parameter at a time) with
    ``rollout.layered_summon``, else ``rollout.update_weights_bucket_megabytes`` (schema defaults when unset)."""
    rollout_cfg = as_rollout_config(rollout_cfg)
    if rollout_cfg.layered_summon:
        return 0
    return int(float(rollout_cfg.update_weights_bucket_megabytes) * (1 << 20))

class ActorRolloutRefWorker(EngineCheckpointMixin, Worker, DistProfilerExtension):
    """Policy roles in one process; see the module docstring for ``role``.

    Config keys read (``actor_rollout_ref.*``): ``model.{path, tokenizer_path, override_config,
    enable_gradient_checkpointing, trust_remote_code, lora_rank, lora_alpha, target_modules, exclude_modules}``,
    ``actor.{ppo_mini_batch_size, ppo_micro_batch_size[_per_gpu], use_dynamic_bsz, optim.*, fsdp_config.*,
    checkpoint}``, ``ref.{log_prob_micro_batch_size[_per_gpu], fsdp_config.*}``, ``rollout.{name, n, temperature,
    top_p, top_k, do_sample, response_length, dtype, val_kwargs, log_prob_micro_batch_size[_per_gpu]}``.
    Per-device batch sizes are derived once in ``__init__`` (errors name the key that does not divide).
    """

    def __init__(self, config, role: str, typed: ActorRolloutRefSections | None = None,
                 agent_loop: Any = None, **kwargs):
        super().__init__()
        # ``rollout.mode=async``: the class that runs the episodes (verl's agent loop unless the composing trainer
        # passes another), as a class or "module:Class", imported on first use
        self._agent_loop_cls = agent_loop or AGENT_LOOP
        if role not in _ROLES:
            raise ValueError(f"ActorRolloutRefWorker: role={role!r} is not one of {_ROLES}")
        self._run_names = trainer_run_names(config)  # the section sent still belongs to the whole config
        self.config = read_only_config(config)
        self.role = role
        self._is_actor = role in ("actor", "actor_rollout", "actor_rollout_ref")
        self._is_rollout = role in ("rollout", "actor_rollout", "actor_rollout_ref")
        self._is_ref = role in ("ref", "actor_rollout_ref")
        # the user's engines / rollouts register first: the typed sections check names against the registries
        import_user_modules(self.config.model.get("external_lib"))
        # the typed sections this worker reads (verl.workers.config): the trainer's (``typed``, built once in the
        # driver) or, for a worker built by hand, the same built here; the rollout engine gets the rollout section
        self.typed = typed = actor_rollout_ref_sections(typed if typed is not None else self.config)
        self.model_config, self.actor_config, self.rollout_config = typed.model, typed.actor, typed.rollout
        self._is_lora = self.model_config.lora_rank > 0
        # LoRA: the reference policy is the actor with its adapters switched off (no second model)
        self._ref_in_actor = self._is_lora and self._is_actor
        if self._ref_in_actor:
            self._is_ref = True
        # profiled steps: the actor's profiler keys govern this worker (a worker without an actor: the rollout's,
        # then the reference's)
        section = "actor" if self._is_actor else "rollout" if self._is_rollout else "ref"
        DistProfilerExtension.__init__(self, DistProfiler(self.rank, (self.config.get(section) or {}).get("profiler")))

        init_distributed(typed.nccl_timeout)
        prefix = "actor_rollout_ref"
        self.dp_size = _register_sp_dispatch(self, "actor", self.actor_config)  # ranks that hold different rows
        self.rollout_layout = self._declare_rollout_layout()
        self.rollout_n = self.rollout_config.n
        self.actor_batch_sizes = None
        if self._is_actor:
            self.actor_batch_sizes = ppo_batch_sizes(self.actor_config, rollout_n=self.rollout_n, dp_size=self.dp_size,
                                                     prefix=f"{prefix}.actor")
        # log-prob passes: (rollout section -> old log-probs, ref section -> reference log-probs)
        self._log_prob_micro = {}
        for section in ("rollout", "ref"):
            sub = self.config.get(section)
            wanted = self._is_actor if section == "rollout" else (self._is_ref and not self._ref_in_actor)
            if wanted and sub is not None:
                self._log_prob_micro[section] = self._log_prob_spec(section)
        if self._ref_in_actor and "rollout" in self._log_prob_micro:
            self._log_prob_micro["ref"] = self._log_prob_micro["rollout"]

        self.actor_engine: TrainEngine | None = None
        self.ref_engine: TrainEngine | None = None
        self.actor = self.ref_policy = None
        self.rollout = self.rollout_sharding_manager = None
        self.tokenizer = self.generation_config = None

    def _declare_rollout_layout(self) -> RolloutLayout:
        """This rank's place among the rollout engines (``rollout.tensor_model_parallel_size`` ranks each, and
        ``rollout.data_parallel_size`` of them in one vLLM engine), declared as the ``rollout`` dispatch mesh.
        Roles without a rollout count as engines of one rank."""
        tp = engine_dp = 1
        if self._is_rollout:
            cfg = self.rollout_config
            tp, engine_dp = cfg.tensor_model_parallel_size, cfg.data_parallel_size
            check_rollout_parallel(name=cfg.name, tp=tp, dp=engine_dp, ep=cfg.expert_parallel_size,
                                   workers=dist.get_world_size(), model_path=None)
        layout = rollout_layout(dist.get_world_size(), dist.get_rank(), tp, engine_dp)
        self._register_dispatch_collect_info("rollout", dp_rank=layout.dp_rank, is_collect=layout.is_collect)
        return layout

    def _log_prob_spec(self, name: str) -> MicroBatchSpec:
        """Micro-batches of a log-prob pass from the ``log_prob_*`` keys of ``actor_rollout_ref.<name>`` (rollout:
        old log-probs, ref: reference log-probs; the yaml's keys follow the actor's batch keys)."""
        if name == "rollout":
            section = self.rollout_config
        else:  # the actor config class the reference is typed as has no log_prob_* keys
            section = self.typed.ref_log_prob
        dynamic = bool(section.log_prob_use_dynamic_bsz)
        return MicroBatchSpec(
            micro_batch_size=log_prob_micro_size(section, self.dp_size, f"actor_rollout_ref.{name}", dynamic),
            use_dynamic_bsz=dynamic, max_token_len=int(section.log_prob_max_token_len_per_gpu))

    # ------------------------------------------------------------------------------------ building
    def _model_path(self) -> str:
        return check_model_dir(local_model_path(self.model_config))

    def _build_engine(self, engine_config: EngineConfig) -> TrainEngine:
        return get_engine_cls(engine_config.strategy).build(engine_config, self.device_mesh, tokenizer=self.tokenizer)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self):
        """Build, per role: the actor engine (model, optimizer, scheduler, checkpoints), the reference engine,
        the rollout engine and the hybrid-engine sharding manager."""
        model_cfg = self.model_config
        trust = model_cfg.trust_remote_code
        self.tokenizer = load_tokenizer(model_cfg.tokenizer_path or self._model_path(), trust,
                                        model_cfg.custom_chat_template)
        self.generation_config = get_generation_config(self._model_path(), trust)
        fsdp_size = self.actor_config.fsdp_config.fsdp_size
        self.device_mesh = build_device_mesh(dist.get_world_size(), fsdp_size)  # FSDP shards over every rank
        sections = {"model": model_cfg, "actor": self.actor_config, "ref": self.typed.ref}

        if self._is_actor:
            self.actor_engine = self._build_engine(actor_engine_config(sections))
            self.actor = DataParallelPPOActor(config=self.actor_config, engine=self.actor_engine,
                                              batch_sizes=self.actor_batch_sizes)
        if self._is_ref:
            if self._ref_in_actor:
                self.ref_policy = self.actor
            else:
                ref_cfg = self.typed.ref
                self.ref_engine = self._build_engine(ref_engine_config(dict(sections, ref=ref_cfg)))
                self.ref_policy = DataParallelPPOActor(config=ref_cfg, engine=self.ref_engine)
        if self._is_rollout:
            self._engine_group, self._round_group = (None, None), None
            # created on every rank, in the same order, before the engines create their own groups
            if self.rollout_layout.tp > 1:
                self._engine_group = new_engine_groups(self.rollout_layout.all_groups())
            if self.rollout_layout.engine_dp > 1:
                self._round_group = new_engine_groups(self.rollout_layout.round_groups())[0]
            self._build_rollout()

    @property
    def actor_module(self):
        """The actor's model (for research code that inspects it; the roles go through the engine)."""
        return getattr(self.actor_engine, "module", None)

    def _build_rollout(self):
        rollout_cfg = self.config.rollout  # a registered rollout class may read keys of its own from the section
        name = self.rollout_config.name
        rollout_cls = get_rollout_class(name)
        engine = self.actor_engine
        self.rollout = rollout_cls(config=rollout_cfg, model_path=self._model_path(), tokenizer=self.tokenizer,
                                   generation_config=self.generation_config,
                                   trust_remote_code=self.model_config.trust_remote_code,
                                   model_hf_config=getattr(engine, "model_config", None),
                                   device_mesh=self.device_mesh, actor_will_push=engine is not None,
                                   device=get_device_name(),
                                   lora_rank=self.model_config.lora_rank)
        layout = self.rollout_layout
        # what the engine itself runs (engines without tensor parallelism report nothing: one rank)
        engine_tp = int(getattr(self.rollout, "tensor_parallel_size", 1))
        engine_rank = int(getattr(self.rollout, "tensor_parallel_rank", 0))
        if (engine_tp, engine_rank) != (layout.tp, layout.tp_rank):
            raise RuntimeError(f"actor_rollout_ref.rollout.tensor_model_parallel_size={layout.tp} (this process: "
                               f"tensor rank {layout.tp_rank}) but the {name} engine runs tensor_parallel_size="
                               f"{engine_tp} with this process as tensor rank {engine_rank}")
        engine_dp = (int(getattr(self.rollout, "engine_dp_size", 1)), int(getattr(self.rollout, "engine_dp_rank", 0)))
        wanted_dp = (layout.engine_dp, layout.dp_rank % layout.engine_dp)
        if engine_dp != wanted_dp:
            raise RuntimeError(f"actor_rollout_ref.rollout.data_parallel_size={layout.engine_dp} (this process: "
                               f"data-parallel rank {wanted_dp[1]}) but the {name} engine runs data_parallel_size="
                               f"{engine_dp[0]} with this process as data-parallel rank {engine_dp[1]}")
        print(f"[rollout] rank {dist.get_rank()}: {name} engine {layout.dp_rank} of {layout.dp}, "
              f"tensor_parallel_size={engine_tp}, tensor rank {engine_rank}"
              + (f", data-parallel rank {engine_dp[1]} of {engine_dp[0]} in one engine" if engine_dp[0] > 1 else ""),
              flush=True)
        if engine is not None:
            stats: dict = {}
            push = self._push_mode(engine)
            stream = ((lambda _module: engine.iter_tp_shards(self.rollout.vocab_shard_range(), stats))
                      if push == "tp_pieces" else
                      (lambda _module: engine.iter_full_params(stats,
                                                               bucket_bytes=push_bucket_bytes(self.rollout_config))))
            if dist.get_rank() == 0:
                print(f"[rollout] weight push: {push} (training {type(engine).__name__}, tensor parallel "
                      f"{getattr(engine, 'tensor_parallel_size', 1)} -> rollout tensor parallel {layout.tp})",
                      flush=True)
            # LoRA actor + an engine that serves adapters (vLLM): base weights once, then the adapter only
            self.rollout_sharding_manager = FSDPRolloutShardingManager(
                engine.module, self.rollout, device_mesh=self.device_mesh,
                layered_summon=self.rollout_config.layered_summon,
                multi_stage_wake_up=self.rollout_config.multi_stage_wake_up,
                full_state_iter=stream, tp_pieces=push == "tp_pieces", stream_stats=stats,
                base_state_iter=lambda module: engine.onloaded(iter_base_tensors(module)),
                adapter_state_iter=lambda module: engine.onloaded(iter_lora_adapter_tensors(module)))

    def _push_mode(self, engine: TrainEngine) -> str:
        """``tp_pieces`` when the training engine's tensor groups are the rollout engines (Megatron with the
        rollout's tensor-parallel size, no LoRA, an engine that takes pieces): each rank hands over its own shard.
        Otherwise ``full``: full tensors gathered in buckets, each engine rank's loaders keep their slice."""
        train_tp = int(getattr(engine, "tensor_parallel_size", 1))
        # (an engine with data parallelism holds only its share of the experts: full tensors, its loaders pick)
        if (train_tp > 1 and train_tp == self.rollout_layout.tp and not self._is_lora
                and self.rollout_layout.engine_dp == 1
                and hasattr(self.rollout, "vocab_shard_range")
                and dist.get_process_group_ranks(engine.layout.tp_group) == self.rollout_layout.group_ranks):
            return "tp_pieces"
        return "full"

    # -------------------------------------------------------------------------------------- rollout
    def _weights_changed(self) -> None:
        if self.rollout_sharding_manager is not None:
            self.rollout_sharding_manager.bump_weight_version()

    @register(dispatch_mode=_ROLLOUT_DP)
    @DistProfiler.annotate(color="red", role="rollout_generate")
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """Sample ``rollout.n`` responses per prompt with this rank's engine (weights pushed first if stale).

        Every rank of an engine (``rollout.tensor_model_parallel_size`` > 1) receives the same prompts and runs the
        same engine calls; the result of the engine's tensor rank 0 is collected.

        ``meta_info["timing"]`` gets ``generate_sequences`` and ``update_weights`` (seconds, max over ranks)."""
        if not self._is_rollout:
            raise RuntimeError(f"generate_sequences needs a rollout role; this worker has role={self.role!r}")
        prompts.meta_info.setdefault("eos_token_id", self._eos_token_id())
        prompts.meta_info.setdefault("pad_token_id", self._pad_token_id())
        manager = self.rollout_sharding_manager or nullcontext()
        start = time.perf_counter()
        with manager:
            push_s = getattr(manager, "timing", {}).get("update_weights", 0.0)
            gen_start = time.perf_counter()
            output = self._rollout_generate(prompts)
            gen_s = time.perf_counter() - gen_start
        total_s = time.perf_counter() - start
        gen_max, push_max, total_max = max_across_ranks([gen_s, push_s, total_s])
        (gen_min,) = min_across_ranks([gen_s])
        output.meta_info["timing"] = {"generate_sequences": gen_max, "update_weights": push_max,
                                      "generation_timing/max": gen_max, "generation_timing/min": gen_min,
                                      "generation_timing/topk_ratio": gen_min / gen_max if gen_max > 0 else 1.0,
                                      "rollout_with_sync": total_max}
        if push_s > 0 and getattr(manager, "push_stats", None):
            # what the push carried (a LoRA actor on vLLM: the adapter only, after the first push); every rank
            # pushed, so each value is the max over ranks
            keys = sorted(manager.push_stats)
            output.meta_info["weight_push"] = dict(zip(keys, max_across_ranks([manager.push_stats[k] for k in keys])))
        return output

    def _rollout_generate(self, prompts: DataProto) -> DataProto:
        """``rollout.mode=sync``: the engine's batch call. ``async`` (verl's default): the agent loop over the
        request-level API, one episode per sample, the loop chosen by the row's ``agent_name``. Prompts with
        images always take the batch call (the agent loop does not carry images)."""
        if self.rollout_config.mode != "async" or _has_images(prompts):
            return self.rollout.generate_sequences(prompts=prompts)
        group, leader = self._engine_group
        if group is not None and not self.rollout_layout.is_collect:
            # tensor-parallel engine: tensor rank 0 runs the agent loop and sends each engine batch here
            follow_engine_leader(self.rollout, group, leader)
            return DataProto(meta_info=dict(prompts.meta_info))
        if getattr(self, "_agent_loop_worker", None) is None:
            # what the agent loop calls: the engine, its tensor ranks following (tp > 1), in rounds with the other
            # data-parallel ranks of a vLLM engine (data_parallel_size > 1)
            engine = self.rollout if group is None else EngineGroupLeader(self.rollout, group, leader)
            if self._round_group is not None:
                engine = EngineRound(engine, self._round_group)
            self._engine_leader = engine if engine is not self.rollout else None
            self._agent_loop_worker = load_class(self._agent_loop_cls)(self.config, engine, self.tokenizer,
                                                                       run_names=self._run_names)
        try:
            return self._agent_loop_worker.generate_sequences(prompts)
        finally:
            if self._engine_leader is not None:
                self._engine_leader.finish()

    def _eos_token_id(self):
        return resolve_special_tokens(self.generation_config, self.tokenizer)[0]

    def _pad_token_id(self):
        return resolve_special_tokens(self.generation_config, self.tokenizer)[1]

    # ------------------------------------------------------------------------------------ log probs
    def _log_prob_meta(self, data: DataProto, section: str) -> None:
        spec = self._log_prob_micro[section]
        data.meta_info["micro_batch_size"] = spec.micro_batch_size
        data.meta_info["max_token_len"] = spec.max_token_len
        data.meta_info["use_dynamic_bsz"] = spec.use_dynamic_bsz
        data.meta_info["temperature"] = self.rollout_config.temperature

    @register(dispatch_mode=_ACTOR_DP)
    @DistProfiler.annotate(color="blue", role="actor_compute_log_prob")
    def compute_log_prob(self, data: DataProto) -> DataProto:
        """Trainer-engine logprobs of the responses -> ``old_log_probs`` and ``entropys``."""
        if not self._is_actor:
            raise RuntimeError(f"compute_log_prob needs an actor role; this worker has role={self.role!r}")
        self._log_prob_meta(data, "rollout")
        # router replay (actor.router_replay.mode=R2): the experts every token was routed to in this pass go into
        # the batch beside old_log_probs, and update_actor computes with them (verl.models.mcore.router_replay)
        record = self.actor.replays_routing
        scored = self.actor.compute_log_prob(data=data, calculate_entropy=True, record_routing=record)
        log_probs, entropys = scored[:2]
        tensors = {"old_log_probs": log_probs}
        if entropys is not None:
            tensors["entropys"] = entropys
        if record:
            tensors["routed_experts"] = scored[2]
        return DataProto.from_dict(tensors=tensors, meta_info={"temperature": data.meta_info["temperature"]})

    @register(dispatch_mode=_ACTOR_DP)
    @DistProfiler.annotate(color="olive", role="ref_compute_log_prob")
    def compute_ref_log_prob(self, data: DataProto) -> DataProto:
        """Reference-policy logprobs -> ``ref_log_prob`` (LoRA actors: adapters disabled)."""
        if not self._is_ref:
            raise RuntimeError(f"compute_ref_log_prob needs a ref role; this worker has role={self.role!r}")
        self._log_prob_meta(data, "ref")
        context = self.actor_engine.disable_adapter() if self._ref_in_actor else nullcontext()
        with context:
            log_probs, _ = self.ref_policy.compute_log_prob(data=data, calculate_entropy=False)
        return DataProto.from_dict(tensors={"ref_log_prob": log_probs})

    # --------------------------------------------------------------------------------------- update
    @register(dispatch_mode=_ACTOR_DP)
    @DistProfiler.annotate(color="red", role="actor_update")
    def update_actor(self, data: DataProto) -> DataProto:
        """One PPO update over ``data`` (mini-batches x ppo_epochs); returns ``meta_info["metrics"]``."""
        if not self._is_actor:
            raise RuntimeError(f"update_actor needs an actor role; this worker has role={self.role!r}")
        data.meta_info.setdefault("temperature", self.rollout_config.temperature)
        start = time.perf_counter()
        metrics = dict(self.actor.update_policy(data=data))
        metrics["perf/update_actor_s"] = time.perf_counter() - start
        metrics["actor/lr"] = self.actor_engine.lr_scheduler_step()
        metrics.update(memory_metrics())
        self._weights_changed()
        on_policy = getattr(self.actor, "last_on_policy", None)  # bypass mode: the update's first-forward scores
        if on_policy is not None:
            return DataProto.from_dict(tensors=on_policy, meta_info={"metrics": metrics})
        return DataProto(meta_info={"metrics": metrics})

    # ----------------------------------------------------------------------------------- checkpoints
    def _require_actor(self, what: str) -> TrainEngine:
        if not self._is_actor:
            raise RuntimeError(f"{what} needs an actor role; this worker has role={self.role!r}")
        return self.actor_engine

    def _checkpoint_engine(self) -> TrainEngine:
        return self._require_actor("a checkpoint")

    def _after_checkpoint_load(self) -> None:
        self._weights_changed()

    # --------------------------------------------------------------------------------- test hooks
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def set_skip_weight_sync(self, skip: bool = True) -> None:
        """Fault switch for tests: stop pushing actor weights into the rollout engine."""
        if self.rollout_sharding_manager is not None:
            self.rollout_sharding_manager.skip_weight_sync = bool(skip)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def get_weight_sync_state(self) -> dict:
        m = self.rollout_sharding_manager
        if m is None:
            return {}
        return {"weight_version": m.weight_version, "num_pushes": m.num_pushes, "stale": m.weights_stale}


# verl's async-server variant is the same worker here (no separate server mode yet)
AsyncActorRolloutRefWorker = ActorRolloutRefWorker


# ----------------------------------------------------------------------------------------------- critic
class CriticWorker(EngineCheckpointMixin, Worker, DistProfilerExtension):
    """Value model (token classification head on the LM body): ``compute_values``, ``update_critic``."""

    def __init__(self, config, typed: CriticConfig | None = None, **kwargs):
        super().__init__()
        self.config = read_only_config(config)
        import_user_modules(self.config.model.get("external_lib"))  # the user's engines register first
        # the trainer's typed section (built once in the driver, LR-schedule length filled in) or built here
        self.critic_config = critic = critic_sections(typed if typed is not None else self.config)
        DistProfilerExtension.__init__(self, DistProfiler(self.rank, self.config.get("profiler")))
        init_distributed()
        self.dp_size = _register_sp_dispatch(self, "critic", critic)
        self.batch_sizes = ppo_batch_sizes(critic, rollout_n=critic.rollout_n, dp_size=self.dp_size, prefix="critic")
        forward_micro = per_device_micro_size(critic, "forward_micro_batch_size",
                                              "forward_micro_batch_size_per_gpu", self.dp_size, "critic")
        self.forward_micro = MicroBatchSpec(
            micro_batch_size=forward_micro if forward_micro is not None else self.batch_sizes.micro_batch_size,
            use_dynamic_bsz=critic.use_dynamic_bsz, max_token_len=critic.forward_max_token_len_per_gpu)
        self.engine: TrainEngine | None = None
        self.critic = None

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self):
        model_cfg = self.critic_config.model
        engine_config = critic_engine_config(self.critic_config)
        trust = model_cfg.trust_remote_code
        self.tokenizer = load_tokenizer(model_cfg.tokenizer_path or engine_config.model_path, trust)
        self.device_mesh = build_device_mesh(dist.get_world_size(), model_cfg.fsdp_config.fsdp_size)
        self.engine = get_engine_cls(engine_config.strategy).build(engine_config, self.device_mesh,
                                                                  tokenizer=self.tokenizer)
        self.critic = DataParallelPPOCritic(config=self.critic_config, engine=self.engine,
                                            batch_sizes=self.batch_sizes)

    @property
    def critic_module(self):
        return getattr(self.engine, "module", None)

    @register(dispatch_mode=_CRITIC_DP)
    @DistProfiler.annotate(color="cyan", role="compute_values")
    def compute_values(self, data: DataProto) -> DataProto:
        """V(s_t) for every response position -> ``values`` (B, R)."""
        data.meta_info["micro_batch_size"] = self.forward_micro.micro_batch_size
        data.meta_info["max_token_len"] = self.forward_micro.max_token_len
        data.meta_info["use_dynamic_bsz"] = self.forward_micro.use_dynamic_bsz
        values = self.critic.compute_values(data=data)
        return DataProto.from_dict(tensors={"values": values})

    @register(dispatch_mode=_CRITIC_DP)
    @DistProfiler.annotate(color="pink", role="critic_update")
    def update_critic(self, data: DataProto) -> DataProto:
        start = time.perf_counter()
        metrics = dict(self.critic.update_critic(data=data))
        metrics["perf/update_critic_s"] = time.perf_counter() - start
        metrics["critic/lr"] = self.engine.lr_scheduler_step()
        return DataProto(meta_info={"metrics": metrics})
