"""One-step-off-policy PPO/GRPO driver (verl's ``one_step_off_policy`` recipe).

The actor (with the reference policy, critic and reward model: the training pool) and the rollout (its own
pool, ``rollout.n_gpus_per_node`` processes) are different worker groups, so generation and training overlap:

=========  ==============================================  ==========================================
step       rollout pool                                     training pool
=========  ==============================================  ==========================================
1          generate batch 1 with version 0 (waited for:     -
           the first step is synchronous), then batch 2
           with version 0                                   train on batch 1 -> version 1
2          (after the push of version 1) batch 3            train on batch 2 (sampled with version 0)
                                                            -> version 2
k >= 2     batch k+1 with version k-1                       train on batch k (sampled with version k-2)
=========  ==============================================  ==========================================

A *version* counts actor updates. Before every launch the rollout is brought to the actor's current version
(:meth:`OneStepOffRayTrainer._push_weights`, through Ray's object store; see ``workers.py``), so the batch a
step trains on is always exactly one update older than the actor that computes its ``old_log_probs``
(``one_step_off/staleness`` = 1 from step 2 on, 0 at step 1). The engine's own log-probs of the sampled tokens
come with the batch (``rollout_log_probs``); ``algorithm.rollout_correction`` (importance weights) corrects the
staleness exactly as it corrects an engine/trainer mismatch, and ``training/rollout_probs_diff_*`` measures it.

Checkpoint/resume: a checkpoint of step k stores the data loader's position *before* the in-flight batch k+1
was drawn. On resume nothing in flight survives: the first step after it regenerates batch k+1, synchronously,
with the restored weights (version k) -- the same prompts as the uninterrupted run, sampled with weights one
update newer, after which the schedule above continues.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np
import ray
import torch
import uuid

from verl.protocol import DataProto, pad_dataproto_to_divisor, unpad_dataproto
from verl.experimental.agent_loop.metrics import agent_loop_metrics
from verl.experimental.one_step_off_policy.workers import DetachActorWorker, DetachRolloutWorker
from verl.trainer.ppo.ray_trainer import RayPPOTrainer, compute_response_mask
from verl.trainer.ppo.utils import Role
from verl.utils.timer import marked_timer

__all__ = ["OneStepOffRayTrainer", "OneStepOffSchedule", "InFlight"]

ROLLOUT_POOL = "rollout_pool"


@dataclass
class InFlight:
    """A generation launched on the rollout pool: the prompt batch (kept for the join), the future of its
    responses and the actor version the rollout had when it started."""

    batch: DataProto
    future: Any
    weight_version: int


class OneStepOffSchedule:
    """The step schedule, free of Ray: ``launch(prompts, version) -> future`` starts a generation, ``push(version)``
    brings the rollout to ``version``. :meth:`step` returns the batch to train on now, having launched the next
    one; the caller bumps :attr:`actor_version` after each update."""

    def __init__(self, launch, push, overlap: bool = True):
        self._launch, self._push, self.overlap = launch, push, overlap
        self.actor_version = 0
        self.rollout_version: Optional[int] = None  # None: the rollout holds the model file's weights
        self.in_flight: Optional[InFlight] = None

    def start(self, prompts) -> InFlight:
        if self.rollout_version != self.actor_version:
            self._push(self.actor_version)
            self.rollout_version = self.actor_version
        return InFlight(prompts, self._launch(prompts, self.actor_version), self.actor_version)

    def step(self, prompts, next_prompts=None) -> InFlight:
        """The generation to train on for ``prompts`` (waited for by the caller via ``.future``), after launching
        the one for ``next_prompts`` (None at the last step). A step with nothing in flight is synchronous; with
        ``overlap=False`` every step is (the synchronous baseline on the same pools)."""
        current = self.in_flight if self.in_flight is not None else self.start(prompts)
        launch_next = next_prompts is not None and self.overlap
        self.in_flight = self.start(next_prompts) if launch_next else None
        return current

    def staleness(self, current: InFlight) -> int:
        return self.actor_version - current.weight_version


class OneStepOffRayTrainer(RayPPOTrainer):
    """:class:`RayPPOTrainer` with the rollout on its own pool, one generation ahead of training (module doc)."""

    def __init__(self, *args, rollout_pool_spec: list[int], overlap: bool = True, **kwargs):
        super().__init__(*args, **kwargs)
        self.overlap = overlap
        self.rollout_pool_spec = list(rollout_pool_spec)
        self.rollout_wg = None
        self._schedule: Optional[OneStepOffSchedule] = None
        self._source = None
        self._lookahead = None
        self._loader_state = None
        self._last_push_s = 0.0

    # ------------------------------------------------------------------------------------------ setup
    def init_workers(self) -> None:
        """The training pool as the PPO trainer builds it, but with an actor-only role, plus the rollout pool."""
        manager = self.resource_pool_manager
        manager.resource_pool_spec[ROLLOUT_POOL] = self.rollout_pool_spec
        manager.mapping[Role.Rollout] = ROLLOUT_POOL
        self.role_worker_mapping[Role.ActorRollout] = ray.remote(DetachActorWorker)
        self.role_worker_mapping[Role.Rollout] = ray.remote(DetachRolloutWorker)
        all_wg = self._spawn_worker_groups(self._worker_specs())
        print(f"One-step-off pools: {manager.resource_pool_spec}")

        self.critic_wg = self.ref_policy_wg = self.rm_wg = None
        for name in ("critic", "ref", "rm"):
            if name in all_wg:
                setattr(self, {"critic": "critic_wg", "ref": "ref_policy_wg", "rm": "rm_wg"}[name], all_wg[name])
                all_wg[name].init_model()
        self.actor_rollout_wg = all_wg["actor"]  # the name the PPO step uses for the actor
        self.actor_rollout_wg.init_model()
        self.rollout_wg = all_wg["rollout"]
        self.rollout_wg.init_model()
        if self.ref_in_actor and self.use_reference_policy:
            self.ref_policy_wg = self.actor_rollout_wg
        self._schedule = OneStepOffSchedule(self._launch_generation, self._push_weights, self.overlap)

    def _worker_specs(self) -> list[tuple[Role, str, dict]]:
        """The PPO trainer's groups with its actor_rollout split in two: an actor-only group and the rollout."""
        _, *others = super()._worker_specs()
        arr, group = self._actor_rollout_ref_sections(), self.config.actor_rollout_ref
        return [(Role.ActorRollout, "actor", dict(config=group, role="actor", typed=arr)),
                (Role.Rollout, "rollout", dict(config=group, role="rollout", typed=arr)), *others]

    # ------------------------------------------------------------------------------------- weights
    def _push_weights(self, version: int) -> None:
        """Actor rank 0 -> object store -> every rollout rank (see ``workers.py``); ``_last_push_s`` is the
        wall time of the whole push (gather, put, fetch, load)."""
        start = time.perf_counter()
        refs = [r for r in self.actor_rollout_wg.publish_weights() if r is not None][0]
        self.rollout_wg.load_weights(refs, version)
        self._last_push_s = time.perf_counter() - start

    def _load_checkpoint(self) -> int:
        step = super()._load_checkpoint()
        if self._schedule is not None:
            self._schedule.actor_version = step  # the rollout still holds the model file: pushed on first launch
            self._schedule.rollout_version = None
        return step

    # ------------------------------------------------------------------------------------- rollout
    def _prepare_prompts(self, batch: DataProto) -> tuple[DataProto, DataProto]:
        batch.non_tensor_batch["uid"] = np.array([str(uuid.uuid4()) for _ in range(len(batch))], dtype=object)
        gen_batch = self._pop_gen_batch(batch)
        return batch, gen_batch

    def _launch_generation(self, prompts: tuple[DataProto, DataProto], version: int):
        _, gen_batch = prompts
        padded, pad_size = pad_dataproto_to_divisor(gen_batch, self.rollout_wg.world_size)
        return padded, pad_size, self.rollout_wg.async_generate_sequences(padded)

    def _collect(self, launched) -> DataProto:
        padded, pad_size, future = launched
        output = future.get()
        per_prompt = len(output) // len(padded)
        return unpad_dataproto(output, pad_size=pad_size * per_prompt)

    def _generate(self, gen_batch: DataProto, timing_raw: Optional[dict] = None) -> DataProto:
        """Validation generation on the rollout pool with the actor's current weights."""
        if self._schedule.rollout_version != self._schedule.actor_version:
            self._push_weights(self._schedule.actor_version)
            self._schedule.rollout_version = self._schedule.actor_version
        output = self._collect(self._launch_generation((None, gen_batch), self._schedule.actor_version))
        timing = output.meta_info.pop("timing", None) or {}
        if timing_raw is not None:
            timing_raw.update(timing)
        return output

    # ---------------------------------------------------------------------------------- data order
    def _train_batches(self):
        """The PPO trainer's batches with a one-batch look-ahead (:meth:`_draw_next`)."""
        self._source = super()._train_batches()
        self._lookahead = None
        while True:
            item, self._lookahead = (self._lookahead, None) if self._lookahead is not None else (
                next(self._source, None), None)
            if item is None:
                return
            yield item

    def _draw_next(self):
        self._loader_state = self.train_dataloader.state_dict()  # the checkpoint's position: before the draw
        self._lookahead = next(self._source, None)
        return self._lookahead

    def _loader_checkpoint_state(self):
        return self._loader_state if self._loader_state is not None else self.train_dataloader.state_dict()

    # --------------------------------------------------------------------------------------- step
    def train_step(self, batch: DataProto, metrics: dict, timing_raw: dict) -> DataProto:
        schedule = self._schedule
        self._last_push_s = 0.0
        cfg, n = self.config, int(self.config.actor_rollout_ref.rollout.n)
        current_prompts = None if schedule.in_flight is not None else self._prepare_prompts(batch)
        next_prompts = None
        with marked_timer("launch_next", timing_raw):
            if self.global_steps < self.total_training_steps and self.overlap:
                nxt = self._draw_next()
                next_prompts = self._prepare_prompts(DataProto.from_single_dict(nxt)) if nxt is not None else None
            else:
                self._loader_state = None
            current = schedule.step(current_prompts, next_prompts)
        push_s = self._last_push_s
        with marked_timer("gen", timing_raw, color="red"):
            gen_output = self._collect(current.future)
        timing_raw.update(gen_output.meta_info.pop("timing", None) or {})
        prompts, _ = current.batch
        full = prompts.repeat(repeat_times=n, interleave=True).union(gen_output)
        if "response_mask" not in full.batch.keys():
            full.batch["response_mask"] = compute_response_mask(full)
        metrics.update(agent_loop_metrics(full))
        metrics.update({"one_step_off/rollout_weight_version": current.weight_version,
                        "one_step_off/actor_weight_version": schedule.actor_version,
                        "one_step_off/staleness": schedule.staleness(current),
                        "one_step_off/weight_push_s": push_s})
        full = self._learn(full, metrics, timing_raw)
        if cfg.trainer.critic_warmup <= self.global_steps:
            schedule.actor_version += 1
        return full
