"""RayPPOTrainer: the single-controller PPO / GRPO driver.

The driver holds the data and runs the algorithm's control flow; every heavy computation is a method call
on a worker group (``actor_rollout_wg``, ``ref_policy_wg``, ``critic_wg``, ``rm_wg``). One step is
``train_step`` below and reads like the algorithm:

    generate n responses per prompt -> response mask -> (balance) -> old log probs (+ entropy)
    -> ref log probs -> values -> rewards (KL-shaped if algorithm.use_kl_in_reward) -> advantages
    (-> PF-PPO resampling) -> critic update -> actor update (after trainer.critic_warmup steps)

Features and how to turn them on:
- estimators: ``algorithm.adv_estimator`` (gae needs the critic, grpo/rloo/... need ``rollout.n > 1``);
- KL: in the reward (``algorithm.use_kl_in_reward=True``, fixed/adaptive ``algorithm.kl_ctrl``) or as a loss
  (``actor_rollout_ref.actor.use_kl_loss=True``); both need the reference policy, which runs in its own
  worker group (or inside the actor with LoRA);
- validation: ``trainer.test_freq`` and ``trainer.val_before_train`` (greedy ``rollout.val_kwargs``), metrics
  ``val-core/<data_source>/reward/mean@N``; ``trainer.log_val_generations`` samples are shown;
- checkpoints: ``trainer.save_freq`` (and the last step), ``trainer.resume_mode=auto|disable|resume_path``,
  ``trainer.max_{actor,critic}_ckpt_to_keep`` (layout in ``verl.trainer.ppo.checkpoint``);
- logging: ``trainer.logger`` (console, file, tensorboard, wandb, mlflow, swanlab, clearml, trackio), a PNG of the
  training curves at the end;
- profiling: ``global_profiler.tool=torch`` with ``global_profiler.steps=[...]`` and a role's
  ``profiler.enable=True``: the workers write a trace of each of that role's calls in those steps
  (``verl.trainer.ppo.profiling``, docs/profiling.md);
- ``trainer.balance_batch``: reorder samples so that every data-parallel rank gets a similar token count;
- ``reward_model.launch_reward_fn_async=True``: the reward function runs as a Ray task launched right after
  generation and is collected only when the rewards are needed, overlapping old log probs / ref / values;
- PF-PPO (``algorithm.use_pf_ppo=True``, GAE only as in verl): after the advantages, the batch is resampled by
  score with ``algorithm.pf_ppo.{reweight_method, weight_pow}`` (seeded per step; ``pf_ppo/unique_rows``);
- ``trainer.rollout_data_dir`` / ``trainer.validation_data_dir``: JSONL dumps of samples.
"""

from __future__ import annotations

import os
import uuid
from copy import deepcopy
from pprint import pprint
from typing import Any, Optional

import numpy as np
import ray
import torch
from omegaconf import OmegaConf
from tqdm import tqdm

from verl.experimental.agent_loop.metrics import agent_loop_metrics
from verl.protocol import DataProto, WorkerError, pad_dataproto_to_divisor, unpad_dataproto
from verl.single_controller.ray import RayWorkerGroup, ResourcePoolManager
from verl.trainer.config_schema.ppo import AlgorithmConfig, PPOTrainerConfig, as_ppo_config
from verl.trainer.ppo import core_algos
from verl.trainer.ppo.checkpoint import CheckpointMixin, stopped_run_error
from verl.trainer.ppo.core_algos import AdvantageEstimator, apply_kl_penalty, compute_advantage
from verl.trainer.ppo.dataloader import release_loader_workers
from verl.trainer.ppo.metric_utils import (
    compute_data_metrics,
    compute_throughout_metrics,
    compute_timing_metrics,
    reduce_metrics,
)
from verl.trainer.ppo.profiling import ProfilingMixin
from verl.trainer.ppo.trainer_data import TrainerDataMixin
from verl.trainer.ppo.worker_groups import WorkerGroupsMixin
from verl.trainer.ppo.reward import compute_reward, compute_reward_async
from verl.trainer.ppo.rollout_corr import compute_rollout_is_weights, on_policy_metrics
from verl.trainer.ppo.utils import (
    Role,
    entropy_metric,
    need_critic,
    need_reference_policy,
    need_reward_model,
    rollout_probs_diff_metrics,
)
from verl.trainer.ppo.validation import ValidationMixin, _val_metric_names  # noqa: F401 (re-exported)
from verl.utils.device import resolve_device
from verl.utils.padding import response_attention_mask
from verl.utils.plotting import plot_training_curves, plottable_metrics
from verl.utils.seqlen_balancing import get_seqlen_balanced_partitions, log_seqlen_unbalance
from verl.utils.timer import marked_timer
from verl.utils.tracking import Tracking, ValidationGenerationsLogger

__all__ = [
    "RayPPOTrainer",
    "Role",
    "ResourcePoolManager",
    "AdvantageEstimator",
    "compute_advantage",
    "apply_kl_penalty",
    "compute_response_mask",
]

# prompt-side keys the rollout consumes; they come back (extended by the responses) in its output
_GEN_BATCH_KEYS = ["input_ids", "attention_mask", "position_ids"]
_GEN_NON_TENSOR_KEYS = ["raw_prompt_ids", "multi_modal_data", "raw_prompt", "tools_kwargs", "interaction_kwargs",
                        "agent_name"]
PLOT_FILE = "training_curves.png"
_PF_PPO_ROW = "pf_ppo_source_row"  # temporary: which pre-resampling row each PF-PPO sample came from


def compute_response_mask(data: DataProto) -> torch.Tensor:
    """1 for response tokens up to and including EOS, 0 after: the response part of ``attention_mask``."""
    return response_attention_mask(data)


class RayPPOTrainer(TrainerDataMixin, WorkerGroupsMixin, CheckpointMixin, ValidationMixin, ProfilingMixin):
    """PPO / GRPO driver over Ray worker groups (see the module docstring for the features)."""

    def __init__(
        self,
        config,
        tokenizer,
        role_worker_mapping: dict,
        resource_pool_manager: ResourcePoolManager,
        ray_worker_group_cls=RayWorkerGroup,
        processor=None,
        reward_fn=None,
        val_reward_fn=None,
        train_dataset=None,
        val_dataset=None,
        collate_fn=None,
        train_sampler=None,
        device_name: Optional[str] = None,
        typed_config: Optional[PPOTrainerConfig] = None,
    ):
        self.config = config  # as given (a recipe may read its own keys); the code below reads the typed view
        self.typed_config = tc = as_ppo_config(config, typed_config)
        self.tokenizer = tokenizer
        self.processor = processor
        self.reward_fn = reward_fn
        self.val_reward_fn = val_reward_fn
        self.role_worker_mapping = role_worker_mapping
        self.resource_pool_manager = resource_pool_manager
        self.ray_worker_group_cls = ray_worker_group_cls

        self.hybrid_engine = tc.actor_rollout_ref.hybrid_engine
        if not self.hybrid_engine:
            raise ValueError("actor_rollout_ref.hybrid_engine=False is not supported: actor and rollout share workers")
        if Role.ActorRollout not in role_worker_mapping:
            raise ValueError(f"role_worker_mapping needs Role.ActorRollout; got {list(role_worker_mapping)}")

        if device_name is None:
            device_name = resolve_device(tc.trainer.device)
        self.device_name = device_name
        self.use_critic = need_critic(config)
        self.use_rm = need_reward_model(role_worker_mapping)
        self.ref_in_actor = int(tc.actor_rollout_ref.model.lora_rank or 0) > 0
        wants_kl = tc.algorithm.use_kl_in_reward or tc.actor_rollout_ref.actor.use_kl_loss
        self.use_reference_policy = need_reference_policy(role_worker_mapping) or (self.ref_in_actor and wants_kl)
        if self.use_critic and Role.Critic not in role_worker_mapping:
            raise ValueError("the config needs a critic (adv_estimator=gae or critic.enable) but role_worker_mapping "
                             "has no Role.Critic")
        self.algorithm: AlgorithmConfig = tc.algorithm  # the algorithm functions read it by attribute
        self.kl_ctrl_in_reward = (
            core_algos.get_kl_controller(self.algorithm.kl_ctrl) if self.algorithm.use_kl_in_reward else None
        )
        self.validation_generations_logger = ValidationGenerationsLogger()
        self.global_steps = 0
        self.metric_history: list[tuple[int, dict]] = []  # plotted at the end of fit()
        self.logger: Optional[Tracking] = None
        self._create_dataloader(train_dataset, val_dataset, collate_fn, train_sampler)

    # -------------------------------------------------------------------------------------- training
    def fit(self) -> None:
        """The training loop (:meth:`_fit`). A worker that dies or raises stops the run at once with an error
        naming the role, rank, step and the last complete checkpoint to resume from."""
        try:
            self._fit()
        except WorkerError as err:
            raise stopped_run_error(err, getattr(self, "global_steps", 0), self._checkpoint_root()) from err

    def _fit(self) -> None:
        """Validate, then step until ``total_training_steps``; log, test, checkpoint."""
        self.logger = Tracking(
            project_name=self.typed_config.trainer.project_name,
            experiment_name=self.typed_config.trainer.experiment_name,
            default_backend=self.typed_config.trainer.logger,
            config=OmegaConf.to_container(self.config, resolve=True),
        )
        self.global_steps = 0
        self._load_checkpoint()

        if self.val_reward_fn is not None and self.typed_config.trainer.val_before_train:
            val_metrics = self._validate()
            pprint(f"Initial validation metrics: {val_metrics}")
            self.logger.log(data=val_metrics, step=self.global_steps)
            self.metric_history.append((self.global_steps, _plottable(val_metrics)))  # step 0 of the accuracy curve
            if self.typed_config.trainer.val_only:
                self._finish()
                return

        progress_bar = tqdm(total=self.total_training_steps, initial=self.global_steps, desc="Training Progress")
        self.global_steps += 1
        last_val_metrics = None
        for batch_dict in self._train_batches():
            metrics: dict[str, Any] = {}
            timing_raw: dict[str, float] = {}
            is_last_step = self.global_steps >= self.total_training_steps
            profile_start, profile_stop = self._profile_bounds()
            if profile_start:
                with marked_timer("start_profile", timing_raw):
                    self._start_profiling(True)

            with marked_timer("step", timing_raw):
                batch = self.train_step(DataProto.from_single_dict(batch_dict), metrics, timing_raw)
                self._maybe_dump_rollouts(batch, timing_raw)
                if self._due(self.typed_config.trainer.test_freq, is_last_step) and self.val_reward_fn is not None:
                    with marked_timer("testing", timing_raw):
                        val_metrics = self._validate()
                    last_val_metrics = val_metrics if is_last_step else last_val_metrics
                    metrics.update(val_metrics)
                if self._due(self.typed_config.trainer.save_freq, is_last_step):
                    with marked_timer("save_checkpoint", timing_raw):
                        self._save_checkpoint()
            if profile_stop:
                with marked_timer("stop_profile", timing_raw):
                    self._stop_profiling(True)

            metrics.update(self._step_metrics(batch, timing_raw))
            self.logger.log(data=metrics, step=self.global_steps)
            self.metric_history.append((self.global_steps, _plottable(metrics)))
            progress_bar.update(1)
            self.global_steps += 1
            if is_last_step:
                pprint(f"Final validation metrics: {last_val_metrics}")
                break
        progress_bar.close()
        self._finish()

    def _train_batches(self):
        """Batches until ``total_training_steps``, epoch after epoch. A loader resumed exactly at the end of an
        epoch may first yield an empty pass; that pass is not an epoch."""
        empty_passes = 0
        while self.global_steps <= self.total_training_steps and empty_passes < 2:
            got_batch = False
            for batch_dict in self.train_dataloader:
                got_batch = True
                yield batch_dict
                if self.global_steps > self.total_training_steps:
                    return
            empty_passes = 0 if got_batch else empty_passes + 1

    def train_step(self, batch: DataProto, metrics: dict, timing_raw: dict) -> DataProto:
        """One PPO / GRPO step on a batch of prompts; returns the full batch (for metrics)."""
        return self._learn(self._rollout(batch, metrics, timing_raw), metrics, timing_raw)

    def _rollout(self, batch: DataProto, metrics: dict, timing_raw: dict) -> DataProto:
        """Generate ``rollout.n`` responses per prompt: each prompt row (with a fresh ``uid``) repeated n times,
        joined with its responses and ``response_mask``."""
        cfg, n = self.typed_config, int(self.typed_config.actor_rollout_ref.rollout.n)
        batch.non_tensor_batch["uid"] = np.array([str(uuid.uuid4()) for _ in range(len(batch))], dtype=object)
        gen_batch = self._pop_gen_batch(batch)

        with marked_timer("gen", timing_raw, color="red"):
            gen_output = self._generate(gen_batch, timing_raw, metrics)
        if cfg.algorithm.adv_estimator == AdvantageEstimator.REMAX.value:
            with marked_timer("gen_max", timing_raw, color="purple"):
                batch.batch["reward_baselines"] = self._greedy_baseline_scores(batch, gen_batch)

        batch = batch.repeat(repeat_times=n, interleave=True).union(gen_output)
        if "response_mask" not in batch.batch.keys():  # multi-turn rollouts bring theirs (0 on tool/user tokens)
            batch.batch["response_mask"] = compute_response_mask(batch)
        metrics.update(agent_loop_metrics(batch))
        return batch

    def _learn(self, batch: DataProto, metrics: dict, timing_raw: dict) -> DataProto:
        """Everything after generation: log probs, values, rewards, advantages, critic and actor updates. A batch
        that already carries ``token_level_scores`` (scored by a recipe, e.g. to filter groups) keeps them."""
        cfg = self.typed_config
        if cfg.trainer.balance_batch:
            self._balance_batch(batch, metrics)
        batch.meta_info["global_token_num"] = torch.sum(batch.batch["attention_mask"], dim=-1).tolist()
        future_reward = None
        scored = "token_level_scores" in batch.batch.keys()
        if cfg.reward_model.launch_reward_fn_async and not scored:
            with marked_timer("reward", timing_raw, color="yellow"):
                batch, future_reward = self._launch_reward(batch)

        batch, bypass = self._old_log_probs(batch, metrics, timing_raw)
        if self.use_reference_policy:
            with marked_timer("ref", timing_raw, color="olive"):
                batch = batch.union(self.ref_policy_wg.compute_ref_log_prob(batch))
        if self.use_critic:
            with marked_timer("values", timing_raw, color="cyan"):
                batch = batch.union(self.critic_wg.compute_values(batch))
        with marked_timer("reward", timing_raw, color="yellow"):
            batch = self._compute_rewards(batch, metrics, future_reward)
        with marked_timer("adv", timing_raw, color="brown"):
            batch = self._compute_advantage(batch, metrics)

        if self.use_critic:
            with marked_timer("update_critic", timing_raw, color="pink"):
                critic_output = self.critic_wg.update_critic(batch)
            metrics.update(reduce_metrics(critic_output.meta_info["metrics"]))
        if cfg.trainer.critic_warmup <= self.global_steps:
            with marked_timer("update_actor", timing_raw, color="red"):
                batch.meta_info["multi_turn"] = False
                actor_output = self.actor_rollout_wg.update_actor(batch)
            metrics.update(reduce_metrics(actor_output.meta_info["metrics"]))
            if bypass and actor_output.batch is not None and len(actor_output) == len(batch):
                metrics.update(on_policy_metrics(actor_output.batch, batch.batch.get("rollout_log_probs", None),
                                                 batch.batch["response_mask"],
                                                 cfg.actor_rollout_ref.actor.loss_agg_mode))
        return batch

    # ----------------------------------------------------------------------------------- step pieces
    def _pop_gen_batch(self, batch: DataProto) -> DataProto:
        non_tensor = [k for k in _GEN_NON_TENSOR_KEYS if k in batch.non_tensor_batch]
        gen_batch = batch.pop(batch_keys=[k for k in _GEN_BATCH_KEYS if k in batch.batch.keys()],
                              non_tensor_batch_keys=non_tensor)
        if self.typed_config.actor_rollout_ref.rollout.mode == "async":
            # agent loops get every row field (reward_model, extra_info, ...) in run(**kwargs), as in verl; a copy:
            # the batch keeps them for the reward
            gen_batch.non_tensor_batch.update({k: v for k, v in batch.non_tensor_batch.items()
                                               if k not in gen_batch.non_tensor_batch})
        gen_batch.meta_info["global_steps"] = self.global_steps
        return gen_batch

    def _generate(self, gen_batch: DataProto, timing_raw: Optional[dict] = None,
                  metrics: Optional[dict] = None) -> DataProto:
        """Rollout with the prompts padded to a multiple of the actor's dp size (output unpadded). When the
        weights were pushed first, ``metrics`` gets ``perf/weight_push_*`` (bytes the engine loaded, bytes received
        from other ranks, peak memory during the push: max over ranks)."""
        wg = self.actor_rollout_wg
        padded, pad_size = pad_dataproto_to_divisor(gen_batch, wg.world_size)
        output = wg.generate_sequences(padded)
        per_prompt = len(output) // len(padded)
        if per_prompt * len(padded) != len(output):
            raise RuntimeError(f"generate_sequences returned {len(output)} rows for {len(padded)} prompts")
        output = unpad_dataproto(output, pad_size=pad_size * per_prompt)
        timing = output.meta_info.pop("timing", None) or {}
        if timing_raw is not None:
            timing_raw.update(timing)
        push = output.meta_info.pop("weight_push", None) or {}
        if metrics is not None:
            metrics.update({f"perf/{key}": value for key, value in push.items()})
        return output

    def _greedy_baseline_scores(self, batch: DataProto, gen_batch: DataProto) -> torch.Tensor:
        """ReMax: the reward of the greedy response is each prompt's baseline."""
        greedy_batch = deepcopy(gen_batch)
        greedy_batch.meta_info["do_sample"] = False
        greedy = self._generate(greedy_batch)
        scored = batch.union(greedy)
        scores, _ = compute_reward(scored, self.reward_fn)
        batch.pop(batch_keys=list(greedy.batch.keys()), non_tensor_batch_keys=list(greedy.non_tensor_batch.keys()))
        return scores.sum(dim=-1)

    def _balance_batch(self, batch: DataProto, metrics: dict, logging_prefix: str = "global_seqlen") -> None:
        """Reorder samples so every dp rank of the actor gets a similar number of tokens."""
        world_size = self.actor_rollout_wg.world_size
        if world_size <= 1 or len(batch) % world_size != 0:
            return
        seqlens = batch.batch["attention_mask"].view(len(batch), -1).sum(-1).tolist()
        partitions = get_seqlen_balanced_partitions(seqlens, k_partitions=world_size, equal_size=True)
        batch.reorder(torch.tensor([j for part in partitions for j in part]))
        metrics.update(log_seqlen_unbalance(seqlen_list=seqlens, partitions=partitions, prefix=logging_prefix))

    def _old_log_probs(self, batch: DataProto, metrics: dict, timing_raw: dict) -> tuple[DataProto, bool]:
        """``old_log_probs`` per ``actor.old_log_prob_source`` and ``algorithm.rollout_correction`` (see
        rollout_corr.py): from the update's own forward (``update``) or the rollout's own in bypass mode (both
        return True; the actor then reports the sync metric), else the trainer's pass, plus truncated IS weights
        when ``rollout_is`` is set."""
        correction = self.typed_config.algorithm.rollout_correction
        if self.typed_config.actor_rollout_ref.actor.old_log_prob_source == "update":
            batch.meta_info["old_log_probs_from_update"] = True  # exact: see resolve_host_defaults
            return batch, True
        if correction.bypass_mode:
            if "rollout_log_probs" not in batch.batch.keys():
                raise RuntimeError("algorithm.rollout_correction.bypass_mode=True needs rollout_log_probs from the "
                                   "rollout engine; this rollout returned none")
            batch.batch["old_log_probs"] = batch.batch["rollout_log_probs"].clone()
            batch.meta_info["bypass_mode"] = True
            if correction.loss_type == "reinforce":
                batch.meta_info["bypass_reinforce"] = {
                    "rollout_is": correction.rollout_is, "rollout_is_threshold": float(correction.rollout_is_threshold),
                    "rollout_is_batch_normalize": bool(correction.rollout_is_batch_normalize)}
            return batch, True
        with marked_timer("old_log_prob", timing_raw, color="blue"):
            batch = batch.union(self._compute_old_log_prob(batch, metrics))
        if correction.rollout_is and "rollout_log_probs" in batch.batch.keys():
            weights, is_metrics = compute_rollout_is_weights(
                batch.batch["old_log_probs"], batch.batch["rollout_log_probs"], batch.batch["response_mask"],
                correction.rollout_is, float(correction.rollout_is_threshold),
                batch_normalize=bool(correction.rollout_is_batch_normalize))
            batch.batch["rollout_is_weights"] = weights
            metrics.update(is_metrics)
        return batch, False

    def _compute_old_log_prob(self, batch: DataProto, metrics: dict) -> DataProto:
        old = self.actor_rollout_wg.compute_log_prob(batch)
        if "entropys" in old.batch.keys():
            metrics["actor/entropy"] = entropy_metric(old.batch["entropys"], batch.batch["response_mask"],
                                                      self.typed_config.actor_rollout_ref.actor.loss_agg_mode)
            old.pop(batch_keys=["entropys"])
        if "rollout_log_probs" in batch.batch.keys():
            metrics.update(rollout_probs_diff_metrics(batch.batch["rollout_log_probs"], old.batch["old_log_probs"],
                                                      batch.batch["response_mask"]))
        return old

    def _launch_reward(self, batch: DataProto) -> tuple[DataProto, ray.ObjectRef]:
        """``reward_model.launch_reward_fn_async``: reward-model scores now (the reward function may read them),
        then the reward function as a Ray task that runs while the workers compute log probs and values."""
        if self.use_rm:
            batch = batch.union(self.rm_wg.compute_rm_score(batch))
        return batch, compute_reward_async.remote(batch, reward_fn=self.reward_fn)

    def _compute_rewards(self, batch: DataProto, metrics: dict, future_reward=None) -> DataProto:
        """token_level_scores from the reward model and/or the reward function (or the Ray task started by
        :meth:`_launch_reward`); token_level_rewards after KL."""
        if future_reward is not None:
            scores, extra_infos = ray.get(future_reward)
        elif "token_level_scores" in batch.batch.keys():  # scored before (DAPO filters groups on the scores)
            scores, extra_infos = batch.batch["token_level_scores"], {}
        else:
            if self.use_rm:
                batch = batch.union(self.rm_wg.compute_rm_score(batch))
            scores, extra_infos = compute_reward(batch, self.reward_fn)
        batch.batch["token_level_scores"] = scores
        if extra_infos:
            batch.non_tensor_batch.update({k: np.array(v) for k, v in extra_infos.items() if len(v) == len(batch)})
        if self.algorithm.use_kl_in_reward:
            batch, kl_metrics = apply_kl_penalty(batch, kl_ctrl=self.kl_ctrl_in_reward,
                                                 kl_penalty=self.algorithm.kl_penalty)
            metrics.update(kl_metrics)
        else:
            batch.batch["token_level_rewards"] = batch.batch["token_level_scores"]
        return batch

    def _compute_advantage(self, batch: DataProto, metrics: dict) -> DataProto:
        """Advantages and returns; with PF-PPO (GAE only, as in verl) ``compute_advantage`` also resamples the
        batch. Its draw is seeded by ``data.seed`` and the step, so a resumed run resamples like an
        uninterrupted one; ``pf_ppo/unique_rows`` counts the distinct samples kept."""
        algo = self.algorithm
        pf_ppo = algo.use_pf_ppo and algo.adv_estimator == AdvantageEstimator.GAE.value
        if pf_ppo:
            batch.batch[_PF_PPO_ROW] = torch.arange(len(batch))
        seed = self.typed_config.data.seed
        with torch.random.fork_rng(devices=[]):
            # the CPU generator only (what fork_rng saves): torch.manual_seed would also queue a lazy CUDA seeding,
            # which records a stack trace (~1 ms) on every call in a process without CUDA
            step_seed = (1 if seed is None else int(seed)) * 1_000_003 + self.global_steps
            torch.random.default_generator.manual_seed(step_seed)
            batch = compute_advantage(
                batch,
                adv_estimator=algo.adv_estimator,
                gamma=algo.gamma,
                lam=algo.lam,
                num_repeat=int(self.typed_config.actor_rollout_ref.rollout.n),
                norm_adv_by_std_in_grpo=algo.norm_adv_by_std_in_grpo,
                config=algo,
            )
        if pf_ppo:
            rows = batch.pop(batch_keys=[_PF_PPO_ROW]).batch[_PF_PPO_ROW]
            metrics["pf_ppo/unique_rows"] = int(torch.unique(rows).numel())
        return batch

    def _step_metrics(self, batch: DataProto, timing_raw: dict) -> dict:
        epoch = (self.global_steps - 1) // max(1, len(self.train_dataloader))  # every epoch has len() batches
        metrics = {"training/global_step": self.global_steps, "training/epoch": epoch}
        metrics.update(compute_data_metrics(batch=batch, use_critic=self.use_critic))
        metrics.update(compute_timing_metrics(batch=batch, timing_raw=timing_raw))
        metrics.update(compute_throughout_metrics(batch=batch, timing_raw=timing_raw, n_gpus=self._n_devices()))
        return metrics

    def _n_devices(self) -> int:
        if self.device_name == "cpu":  # a worker process is a device
            return sum(sum(v) for v in self.resource_pool_manager.resource_pool_spec.values())
        return self.resource_pool_manager.get_n_gpus()

    def _due(self, freq: Optional[int], is_last_step: bool) -> bool:
        """Every ``freq`` steps and at the last step; never when ``freq`` <= 0."""
        return freq is not None and freq > 0 and (is_last_step or self.global_steps % freq == 0)

    # ----------------------------------------------------------------------------------------- finish
    def _finish(self) -> None:
        for loader in (getattr(self, "train_dataloader", None), getattr(self, "val_dataloader", None)):
            release_loader_workers(loader)

        if self.metric_history:
            path = os.path.join(self._checkpoint_root(), PLOT_FILE)
            title = f"{self.typed_config.trainer.project_name} / {self.typed_config.trainer.experiment_name}"
            if plot_training_curves(self.metric_history, path, title=title):
                print(f"Training curves: {path}")
        if self.logger is not None:
            self.logger.finish()


def _plottable(metrics: dict) -> dict:
    return plottable_metrics(metrics)
