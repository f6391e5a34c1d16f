"""FSDP2 workers: the roles a PPO/GRPO driver calls through Ray worker groups.

``ActorRolloutRefWorker(config=<actor_rollout_ref subtree>, role=...)``, one process per device, roles:

=====================  ===========================================================================
``actor``              FSDP2 policy + optimizer + lr scheduler: ``compute_log_prob``, ``update_actor``
``rollout``            a rollout engine only (weights from ``model.path``): ``generate_sequences``
``ref``                a frozen FSDP2 copy of the initial policy: ``compute_ref_log_prob``
``actor_rollout``      the hybrid engine: actor + rollout engine in one process; before generating, the
                       sharding manager streams the actor's new weights into the engine
``actor_rollout_ref``  the same plus the reference policy (with LoRA: the actor with adapters disabled)
=====================  ===========================================================================

Engine pieces come from ``verl.utils.fsdp_utils`` (FSDP2 wrapping, optimizer, scheduler, full-state
streaming), ``verl.workers.actor.dp_actor`` / ``verl.workers.critic.dp_critic`` (micro-batched loss and
update), ``verl.utils.checkpoint`` (sharded checkpoints) and ``verl.workers.rollout`` (engines by name). This
module only wires them together per role, normalises batch sizes (see ``config_utils``) and reports metrics.

``CriticWorker(config=<critic subtree>)`` (``compute_values``, ``update_critic``) and
``RewardModelWorker(config=<reward_model subtree>)`` (``compute_rm_score``) complete verl's set.

On CPU every process uses gloo and the thread share its worker group gave it (``VERL_NUM_THREADS``).
"""

from __future__ import annotations

import logging
import time
from contextlib import nullcontext

import torch
import torch.distributed as dist

from verl.protocol import DataProto
from verl.single_controller.base import Worker
from verl.single_controller.base.decorator import Dispatch, register
from verl.utils.device import get_device_name
from verl.workers.config_utils import (as_mutable_config, memory_metrics, normalize_log_prob_batch_sizes,
                                       normalize_micro_key, normalize_ppo_batch_sizes, require_log_prob_micro)
from verl.workers.rollout.utils import cfg_get
from verl.workers.worker_utils import (build_device_mesh, build_optimizer_and_scheduler, current_lr,
                                       init_distributed, load_checkpoint_with, load_tokenizer, make_checkpoint_manager,
                                       max_across_ranks, min_across_ranks, same_tokenizer, wrap_fsdp)

__all__ = ["ActorRolloutRefWorker", "AsyncActorRolloutRefWorker", "CriticWorker", "RewardModelWorker"]

logger = logging.getLogger(__name__)

_ROLES = ("actor", "rollout", "ref", "actor_rollout", "actor_rollout_ref")


# ------------------------------------------------------------------------------------ actor/rollout/ref
class ActorRolloutRefWorker(Worker):
    """Policy roles in one process; see the module docstring for ``role``.

    Config keys read (``actor_rollout_ref.*``): ``model.{path, tokenizer_path, override_config,
    enable_gradient_checkpointing, trust_remote_code, lora_rank, lora_alpha, target_modules, exclude_modules}``,
    ``actor.{ppo_mini_batch_size, ppo_micro_batch_size[_per_gpu], use_dynamic_bsz, optim.*, fsdp_config.*,
    checkpoint}``, ``ref.{log_prob_micro_batch_size[_per_gpu], fsdp_config.*}``, ``rollout.{name, n, temperature,
    top_p, top_k, do_sample, response_length, dtype, val_kwargs, log_prob_micro_batch_size[_per_gpu]}``.
    Batch sizes are normalised per device in ``__init__`` (errors name the key that does not divide).
    """

    def __init__(self, config, role: str, **kwargs):
        super().__init__()
        if role not in _ROLES:
            raise ValueError(f"ActorRolloutRefWorker: role={role!r} is not one of {_ROLES}")
        self.config = as_mutable_config(config, copy=True)
        self.role = role
        self._is_actor = role in ("actor", "actor_rollout", "actor_rollout_ref")
        self._is_rollout = role in ("rollout", "actor_rollout", "actor_rollout_ref")
        self._is_ref = role in ("ref", "actor_rollout_ref")
        self._is_lora = int(cfg_get(self.config.get("model"), "lora_rank", 0)) > 0
        # LoRA: the reference policy is the actor with its adapters switched off (no second model)
        self._ref_in_actor = self._is_lora and self._is_actor
        if self._ref_in_actor:
            self._is_ref = True

        init_distributed()
        self.dp_size = dist.get_world_size()
        self.rollout_n = int(cfg_get(self.config.get("rollout"), "n", 1))
        if self._is_actor:
            normalize_ppo_batch_sizes(self.config.actor, rollout_n=self.rollout_n, dp_size=self.dp_size,
                                      prefix="actor_rollout_ref.actor")
        if self._is_rollout and self.config.get("rollout") is not None:
            normalize_log_prob_batch_sizes(self.config.rollout, self.dp_size, "actor_rollout_ref.rollout")
        if self._is_ref and self.config.get("ref") is not None:
            normalize_log_prob_batch_sizes(self.config.ref, self.dp_size, "actor_rollout_ref.ref")

        self.actor_module = self.actor = self.actor_optimizer = self.actor_lr_scheduler = None
        self.ref_module = self.ref_policy = None
        self.rollout = self.rollout_sharding_manager = None
        self.checkpoint_manager = None
        self.tokenizer = self.generation_config = None

    # ------------------------------------------------------------------------------------ building
    def _model_path(self) -> str:
        path = cfg_get(self.config.model, "path")
        from verl.utils.model import check_model_dir

        return check_model_dir(path)

    def _build_policy_module(self, fsdp_config, *, trainable: bool):
        """Load the HF causal LM (fp32 master weights unless fsdp_config.model_dtype says otherwise), add LoRA
        when trainable and configured, and shard it with FSDP2."""
        from verl.utils.model import load_causal_lm

        model_cfg = self.config.model
        torch.manual_seed(int(cfg_get(fsdp_config, "seed", 42)))  # identical init on every rank
        module = load_causal_lm(self._model_path(), dtype=cfg_get(fsdp_config, "model_dtype", "fp32"),
                                override_config=cfg_get(model_cfg, "override_config", None),
                                trust_remote_code=bool(cfg_get(model_cfg, "trust_remote_code", False)))
        if trainable:
            if self._is_lora:
                module = self._add_lora(module)
            if bool(cfg_get(model_cfg, "enable_gradient_checkpointing", False)):
                from verl.utils.fsdp_utils import enable_gradient_checkpointing

                enable_gradient_checkpointing(module)
        else:
            module.requires_grad_(False)
        return wrap_fsdp(module, fsdp_config, self.device_mesh)

    def _add_lora(self, module):
        from verl.utils.fsdp_utils import apply_lora

        model_cfg = self.config.model
        module.enable_input_require_grads()
        return apply_lora(module, int(model_cfg.lora_rank), lora_alpha=cfg_get(model_cfg, "lora_alpha", 16),
                          target_modules=cfg_get(model_cfg, "target_modules", "all-linear"),
                          exclude_modules=cfg_get(model_cfg, "exclude_modules", None))

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self):
        """Build, per role: the FSDP2 actor (+ optimizer, scheduler, checkpoint manager), the reference policy,
        the rollout engine and the hybrid-engine sharding manager."""
        from verl.workers.actor.dp_actor import DataParallelPPOActor

        model_cfg = self.config.model
        trust = bool(cfg_get(model_cfg, "trust_remote_code", False))
        self.tokenizer = load_tokenizer(cfg_get(model_cfg, "tokenizer_path", None) or self._model_path(), trust)
        from verl.utils.model import get_generation_config

        self.generation_config = get_generation_config(self._model_path(), trust)
        actor_cfg = self.config.get("actor")
        fsdp_size = int(cfg_get(cfg_get(actor_cfg, "fsdp_config"), "fsdp_size", -1))
        self.device_mesh = build_device_mesh(self.dp_size, fsdp_size)

        if self._is_actor:
            self.actor_module = self._build_policy_module(actor_cfg.fsdp_config, trainable=True)
            self.actor_optimizer, self.actor_lr_scheduler = build_optimizer_and_scheduler(self.actor_module, actor_cfg.optim)
            self.actor = DataParallelPPOActor(config=actor_cfg, actor_module=self.actor_module,
                                              actor_optimizer=self.actor_optimizer)
        if self._is_ref:
            if self._ref_in_actor:
                self.ref_policy = self.actor
            else:
                ref_cfg = self._ref_config()
                self.ref_module = self._build_policy_module(ref_cfg.fsdp_config, trainable=False)
                self.ref_policy = DataParallelPPOActor(config=ref_cfg, actor_module=self.ref_module)
        if self._is_rollout:
            self._build_rollout()

    def _ref_config(self):
        """The ref subtree, completed with the actor's forward-relevant keys (as verl copies them over)."""
        from omegaconf import OmegaConf

        ref_cfg = as_mutable_config(self.config.get("ref") or {}, copy=True)
        actor_cfg = self.config.get("actor") or {}
        for key in ("use_remove_padding", "ulysses_sequence_parallel_size", "use_fused_kernels",
                    "entropy_from_logits_with_chunking", "entropy_checkpointing", "ppo_mini_batch_size",
                    "ppo_micro_batch_size_per_gpu", "use_dynamic_bsz", "ppo_max_token_len_per_gpu", "clip_ratio",
                    "loss_agg_mode", "ppo_epochs", "shuffle", "policy_loss", "grad_clip", "strategy"):
            if ref_cfg.get(key) is None and actor_cfg.get(key) is not None:
                ref_cfg[key] = actor_cfg.get(key)
        if ref_cfg.get("fsdp_config") is None:
            ref_cfg["fsdp_config"] = OmegaConf.create({})
        return ref_cfg

    def _build_rollout(self):
        from verl.workers.rollout import get_rollout_class
        from verl.workers.sharding_manager import FSDPRolloutShardingManager

        rollout_cfg = self.config.rollout
        name = cfg_get(rollout_cfg, "name", "hf")
        rollout_cls = get_rollout_class(name)
        self.rollout = rollout_cls(config=rollout_cfg, model_path=self._model_path(), tokenizer=self.tokenizer,
                                   generation_config=self.generation_config,
                                   trust_remote_code=bool(cfg_get(self.config.model, "trust_remote_code", False)),
                                   model_hf_config=getattr(self.actor_module, "config", None),
                                   device_mesh=self.device_mesh, actor_will_push=self.actor_module is not None,
                                   device=get_device_name())
        if self.actor_module is not None:
            self.rollout_sharding_manager = FSDPRolloutShardingManager(self.actor_module, self.rollout,
                                                                       device_mesh=self.device_mesh)

    # -------------------------------------------------------------------------------------- rollout
    def _weights_changed(self) -> None:
        if self.rollout_sharding_manager is not None:
            self.rollout_sharding_manager.bump_weight_version()

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """Sample ``rollout.n`` responses per prompt with this rank's engine (weights pushed first if stale).

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
            output = self.rollout.generate_sequences(prompts=prompts)
            gen_s = time.perf_counter() - gen_start
        total_s = time.perf_counter() - start
        gen_max, push_max, total_max = max_across_ranks([gen_s, push_s, total_s])
        (gen_min,) = min_across_ranks([gen_s])
        output.meta_info["timing"] = {"generate_sequences": gen_max, "update_weights": push_max,
                                      "generation_timing/max": gen_max, "generation_timing/min": gen_min,
                                      "generation_timing/topk_ratio": gen_min / gen_max if gen_max > 0 else 1.0,
                                      "rollout_with_sync": total_max}
        return output

    def _eos_token_id(self):
        for src in (self.generation_config, self.tokenizer):
            eos = getattr(src, "eos_token_id", None)
            if eos is not None:
                return eos
        return None

    def _pad_token_id(self):
        pad = getattr(self.tokenizer, "pad_token_id", None)
        if pad is None:
            pad = getattr(self.generation_config, "pad_token_id", None)
        return pad

    # ------------------------------------------------------------------------------------ log probs
    def _log_prob_meta(self, data: DataProto, src_cfg) -> None:
        actor_cfg = self.config.get("actor")
        dynamic = bool(cfg_get(src_cfg, "log_prob_use_dynamic_bsz", cfg_get(actor_cfg, "use_dynamic_bsz", False)))
        data.meta_info["micro_batch_size"] = require_log_prob_micro(src_cfg, "actor_rollout_ref."
                                                                   + ("ref" if src_cfg is self.config.get("ref")
                                                                      else "rollout"), dynamic)
        data.meta_info["max_token_len"] = int(cfg_get(src_cfg, "log_prob_max_token_len_per_gpu",
                                                      cfg_get(actor_cfg, "ppo_max_token_len_per_gpu", 16384)))
        data.meta_info["use_dynamic_bsz"] = dynamic
        data.meta_info["temperature"] = float(cfg_get(self.config.get("rollout"), "temperature", 1.0))

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_log_prob(self, data: DataProto) -> DataProto:
        """Trainer-engine logprobs of the responses -> ``old_log_probs`` and ``entropys``."""
        if not self._is_actor:
            raise RuntimeError(f"compute_log_prob needs an actor role; this worker has role={self.role!r}")
        self._log_prob_meta(data, self.config.rollout)
        log_probs, entropys = self.actor.compute_log_prob(data=data, calculate_entropy=True)
        tensors = {"old_log_probs": log_probs}
        if entropys is not None:
            tensors["entropys"] = entropys
        return DataProto.from_dict(tensors=tensors, meta_info={"temperature": data.meta_info["temperature"]})

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_ref_log_prob(self, data: DataProto) -> DataProto:
        """Reference-policy logprobs -> ``ref_log_prob`` (LoRA actors: adapters disabled)."""
        if not self._is_ref:
            raise RuntimeError(f"compute_ref_log_prob needs a ref role; this worker has role={self.role!r}")
        self._log_prob_meta(data, self.config.get("ref") if not self._ref_in_actor else self.config.rollout)
        context = self.actor_module.disable_adapter() if self._ref_in_actor else nullcontext()
        with context:
            log_probs, _ = self.ref_policy.compute_log_prob(data=data, calculate_entropy=False)
        return DataProto.from_dict(tensors={"ref_log_prob": log_probs})

    # --------------------------------------------------------------------------------------- update
    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def update_actor(self, data: DataProto) -> DataProto:
        """One PPO update over ``data`` (mini-batches x ppo_epochs); returns ``meta_info["metrics"]``."""
        if not self._is_actor:
            raise RuntimeError(f"update_actor needs an actor role; this worker has role={self.role!r}")
        data.meta_info.setdefault("temperature", float(cfg_get(self.config.get("rollout"), "temperature", 1.0)))
        start = time.perf_counter()
        metrics = dict(self.actor.update_policy(data=data))
        metrics["perf/update_actor_s"] = time.perf_counter() - start
        metrics["actor/lr"] = current_lr(self.actor_lr_scheduler, self.actor_optimizer)
        if self.actor_lr_scheduler is not None:
            self.actor_lr_scheduler.step()
        metrics.update(memory_metrics())
        self._weights_changed()
        on_policy = getattr(self.actor, "last_on_policy", None)  # bypass mode: the update's first-forward scores
        if on_policy is not None:
            return DataProto.from_dict(tensors=on_policy, meta_info={"metrics": metrics})
        return DataProto(meta_info={"metrics": metrics})

    # ----------------------------------------------------------------------------------- checkpoints
    def _checkpointer(self):
        """The sharded checkpoint manager of the actor (built on first use)."""
        if not self._is_actor:
            raise RuntimeError(f"checkpoints need an actor role; this worker has role={self.role!r}")
        if self.checkpoint_manager is None:
            self.checkpoint_manager = make_checkpoint_manager(self.actor_module, self.actor_optimizer,
                                                               self.actor_lr_scheduler, self.tokenizer,
                                                               cfg_get(self.config.actor, "checkpoint", None))
        return self.checkpoint_manager

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, local_path, hdfs_path=None, global_step=0, max_ckpt_to_keep=None):
        self._checkpointer().save_checkpoint(local_path=local_path, global_step=global_step,
                                                max_ckpt_to_keep=max_ckpt_to_keep)
        dist.barrier()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, local_path, hdfs_path=None, del_local_after_load=False):
        load_checkpoint_with(self._checkpointer(), local_path, del_local_after_load)
        dist.barrier()
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
class CriticWorker(Worker):
    """Value model (token classification head on the LM body), FSDP2: ``compute_values``, ``update_critic``."""

    def __init__(self, config, **kwargs):
        super().__init__()
        self.config = as_mutable_config(config, copy=True)
        init_distributed()
        self.dp_size = dist.get_world_size()
        rollout_n = int(cfg_get(self.config, "rollout_n", 1))
        normalize_ppo_batch_sizes(self.config, rollout_n=rollout_n, dp_size=self.dp_size, prefix="critic")
        normalize_micro_key(self.config, "forward_micro_batch_size", "forward_micro_batch_size_per_gpu",
                            self.dp_size, "critic")
        if self.config.get("forward_micro_batch_size_per_gpu") is None:
            self.config["forward_micro_batch_size_per_gpu"] = self.config.get("ppo_micro_batch_size_per_gpu")
        self.critic_module = self.critic = self.critic_optimizer = self.critic_lr_scheduler = None
        self.checkpoint_manager = None

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self):
        from verl.utils.model import check_model_dir, load_value_model
        from verl.workers.critic.dp_critic import DataParallelPPOCritic

        model_cfg = self.config.model
        path = check_model_dir(cfg_get(model_cfg, "path"))
        trust = bool(cfg_get(model_cfg, "trust_remote_code", False))
        self.tokenizer = load_tokenizer(cfg_get(model_cfg, "tokenizer_path", None) or path, trust)
        fsdp_config = cfg_get(model_cfg, "fsdp_config", {})
        self.device_mesh = build_device_mesh(self.dp_size, int(cfg_get(fsdp_config, "fsdp_size", -1)))
        torch.manual_seed(int(cfg_get(fsdp_config, "seed", 42)))
        module = load_value_model(path, dtype=cfg_get(fsdp_config, "model_dtype", "fp32"),
                                  override_config=cfg_get(model_cfg, "override_config", None),
                                  trust_remote_code=trust)
        if bool(cfg_get(model_cfg, "enable_gradient_checkpointing", False)):
            from verl.utils.fsdp_utils import enable_gradient_checkpointing

            enable_gradient_checkpointing(module)
        self.critic_module = wrap_fsdp(module, fsdp_config, self.device_mesh)
        self.critic_optimizer, self.critic_lr_scheduler = build_optimizer_and_scheduler(self.critic_module,
                                                                                 self.config.optim)
        self.critic = DataParallelPPOCritic(config=self.config, critic_module=self.critic_module,
                                            critic_optimizer=self.critic_optimizer)

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_values(self, data: DataProto) -> DataProto:
        """V(s_t) for every response position -> ``values`` (B, R)."""
        data.meta_info["micro_batch_size"] = self.config.get("forward_micro_batch_size_per_gpu")
        data.meta_info["max_token_len"] = int(cfg_get(self.config, "forward_max_token_len_per_gpu",
                                                      cfg_get(self.config, "ppo_max_token_len_per_gpu", 32768)))
        data.meta_info["use_dynamic_bsz"] = bool(cfg_get(self.config, "use_dynamic_bsz", False))
        values = self.critic.compute_values(data=data)
        return DataProto.from_dict(tensors={"values": values})

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def update_critic(self, data: DataProto) -> DataProto:
        start = time.perf_counter()
        metrics = dict(self.critic.update_critic(data=data))
        metrics["perf/update_critic_s"] = time.perf_counter() - start
        metrics["critic/lr"] = current_lr(self.critic_lr_scheduler, self.critic_optimizer)
        if self.critic_lr_scheduler is not None:
            self.critic_lr_scheduler.step()
        return DataProto(meta_info={"metrics": metrics})

    def _checkpointer(self):
        if self.checkpoint_manager is None:
            self.checkpoint_manager = make_checkpoint_manager(self.critic_module, self.critic_optimizer,
                                                               self.critic_lr_scheduler, self.tokenizer,
                                                               cfg_get(self.config, "checkpoint", None))
        return self.checkpoint_manager

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, local_path, hdfs_path=None, global_step=0, max_ckpt_to_keep=None):
        self._checkpointer().save_checkpoint(local_path=local_path, global_step=global_step,
                                                max_ckpt_to_keep=max_ckpt_to_keep)
        dist.barrier()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, local_path, hdfs_path=None, del_local_after_load=False):
        load_checkpoint_with(self._checkpointer(), local_path, del_local_after_load)
        dist.barrier()

# ------------------------------------------------------------------------------------------ reward model
class RewardModelWorker(Worker):
    """A sequence-classification reward model -> ``rm_scores`` (B, R): the score sits on the last valid response
    token, zeros elsewhere (verl's token-level layout).

    When ``reward_model.model.input_tokenizer`` (the policy's tokenizer) differs from the RM's own tokenizer,
    every sample is decoded and re-encoded for the RM: with ``raw_prompt`` (chat messages) present, the chat plus
    the decoded response as the assistant turn goes through the RM tokenizer's chat template; otherwise the
    decoded prompt text plus response text is re-tokenised. ``reward_model.max_length`` bounds the RM input.
    The RM is forward-only and small on CPU, so each process keeps a full (unsharded) copy.
    """

    def __init__(self, config, **kwargs):
        super().__init__()
        self.config = as_mutable_config(config, copy=True)
        init_distributed()
        self.dp_size = dist.get_world_size()
        normalize_micro_key(self.config, "micro_batch_size", "micro_batch_size_per_gpu", self.dp_size, "reward_model")
        self.reward_module = self.tokenizer = self.input_tokenizer = None
        self._switch_template = False

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self):
        from verl.utils.model import check_model_dir, load_reward_model

        model_cfg = self.config.model
        path = check_model_dir(cfg_get(model_cfg, "path"))
        trust = bool(cfg_get(model_cfg, "trust_remote_code", False))
        self.tokenizer = load_tokenizer(path, trust)
        src = cfg_get(model_cfg, "input_tokenizer", None)
        if src is not None:
            self.input_tokenizer = load_tokenizer(src, trust)
            self._switch_template = not same_tokenizer(self.input_tokenizer, self.tokenizer)
        torch.manual_seed(int(cfg_get(cfg_get(model_cfg, "fsdp_config"), "seed", 42)))
        dtype = cfg_get(cfg_get(model_cfg, "fsdp_config"), "model_dtype", "fp32")
        self.reward_module = load_reward_model(path, dtype=dtype, trust_remote_code=trust).eval()
        self.reward_module.requires_grad_(False)

    def _token_scores(self, input_ids, attention_mask, position_ids) -> torch.Tensor:
        """Per-token scores (B, S): the classification head applied to every position of the RM body."""
        model = self.reward_module
        body = getattr(model, model.base_model_prefix)
        head = next(getattr(model, n) for n in ("score", "classifier", "v_head") if hasattr(model, n))
        hidden = body(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                      use_cache=False).last_hidden_state
        return head(hidden).squeeze(-1).float()

    @torch.inference_mode()
    def _score(self, data: DataProto) -> torch.Tensor:
        """One score per row: the head at the last valid token (max of position_ids over the mask)."""
        ids, mask = data.batch["input_ids"], data.batch["attention_mask"]
        pos = data.batch["position_ids"]
        micro = int(self.config.get("micro_batch_size_per_gpu") or ids.size(0))
        scores = []
        for s in range(0, ids.size(0), micro):
            tok = self._token_scores(ids[s:s + micro], mask[s:s + micro], pos[s:s + micro])
            last = torch.argmax(pos[s:s + micro] * mask[s:s + micro], dim=-1)
            scores.append(tok[torch.arange(tok.size(0)), last])
        return torch.cat(scores)

    def _retokenize(self, data: DataProto) -> DataProto:
        """Decode with the policy tokenizer and encode with the RM tokenizer (right padded)."""
        from verl.utils.model import compute_position_id_with_mask

        src, dst = self.input_tokenizer, self.tokenizer
        prompts, responses = data.batch["prompts"], data.batch["responses"]
        plen = prompts.size(1)
        mask = data.batch["attention_mask"]
        raw = data.non_tensor_batch.get("raw_prompt")
        texts = []
        for i in range(len(data)):
            prompt_ids = prompts[i][mask[i, :plen].bool()].tolist()
            response_ids = responses[i][mask[i, plen:].bool()].tolist()
            response = src.decode(response_ids, skip_special_tokens=True)
            if raw is not None and getattr(dst, "chat_template", None):
                chat = list(raw[i]) + [{"role": "assistant", "content": response}]
                text = dst.apply_chat_template(chat, tokenize=False, add_generation_prompt=False)
                if dst.bos_token and text.startswith(dst.bos_token):
                    text = text[len(dst.bos_token):]  # the tokenizer adds it again when encoding
            else:
                text = src.decode(prompt_ids, skip_special_tokens=False) + response
            texts.append(text)
        max_length = int(self.config.get("max_length") or mask.size(1))
        old_side = dst.padding_side
        dst.padding_side = "right"
        try:
            enc = dst(texts, return_tensors="pt", padding="max_length", truncation=True, max_length=max_length)
        finally:
            dst.padding_side = old_side
        rm_mask = enc["attention_mask"]
        return DataProto.from_dict({"input_ids": enc["input_ids"], "attention_mask": rm_mask,
                                    "position_ids": compute_position_id_with_mask(rm_mask)})

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_rm_score(self, data: DataProto) -> DataProto:
        """``rm_scores`` (B, R): the RM's score at the last valid response token."""
        rm_data = self._retokenize(data) if self._switch_template else data
        scores = self._score(rm_data)
        mask, pos = data.batch["attention_mask"], data.batch["position_ids"]
        response_length = data.batch["responses"].size(-1)
        last = torch.argmax(pos * mask, dim=-1)
        token_level = torch.zeros(mask.shape, dtype=torch.float32)
        token_level[torch.arange(mask.size(0)), last] = scores
        return DataProto.from_dict(tensors={"rm_scores": token_level[:, -response_length:]})
