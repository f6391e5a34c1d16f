"""RayDAPOTrainer: the PPO/GRPO driver with DAPO's dynamic sampling.

One step, as in the DAPO paper's algorithm box:

    repeat: draw data.gen_batch_size prompts -> n responses each -> score them -> drop the groups whose
            algorithm.filter_groups.metric is equal for all n responses -> keep the rest
    until data.train_batch_size prompts' groups are kept (or max_num_gen_batches rounds: an error)
    cut the kept groups to train_batch_size -> log probs, advantages, update (as in PPO)

The other DAPO ingredients are keys of the shared trainer: clip-higher (``actor.clip_ratio_low`` /
``clip_ratio_high``), token-level loss aggregation (``actor.loss_agg_mode=token-mean``) and the overlong reward
shaping of the ``dapo`` reward manager (``reward_model.overlong_buffer``). With ``filter_groups.enable=False``
every generated group is trained on, like ``main_ppo``.

Metrics added per step: ``train/num_gen_batches`` (generation rounds this step), ``train/kept_groups`` and
``train/dropped_groups`` (over all rounds, before the surplus is cut) and ``train/gen_score/mean`` (mean score of
every generated response; ``critic/score/mean`` covers only the trained, filtered groups).
"""

from __future__ import annotations

import numpy as np

from recipe.dapo.dynamic_sampling import DynamicSampler
from verl.protocol import DataProto
from verl.trainer.main_ppo import TaskRunner
from verl.trainer.ppo.ray_trainer import RayPPOTrainer
from verl.trainer.ppo.reward import compute_reward
from verl.utils.timer import marked_timer


class RayDAPOTrainer(RayPPOTrainer):
    """RayPPOTrainer whose step generates rounds of ``data.gen_batch_size`` prompts until enough groups carry a
    learning signal; everything after the filter is the PPO step (``_learn``)."""

    def _loader_batch(self) -> tuple[int, str]:
        gen_bsz = self.typed_config.data.gen_batch_size
        if gen_bsz is None:
            return super()._loader_batch()
        return int(gen_bsz), "data.gen_batch_size"

    def _train_batches(self):
        # kept so that a step can draw further rounds from the same (resumable) loader
        self._batch_source = super()._train_batches()
        return self._batch_source

    def _next_round(self) -> DataProto:
        try:
            return DataProto.from_single_dict(next(self._batch_source))
        except StopIteration:
            raise RuntimeError("dynamic sampling ran out of training data in the middle of a step (the loader "
                               "yielded no batch); check data.train_files and data.gen_batch_size") from None

    def _score(self, batch: DataProto, timing_raw: dict) -> DataProto:
        """``token_level_scores`` (and the reward function's per-sample extra values) of one round."""
        with marked_timer("reward", timing_raw, color="yellow"):
            if self.use_rm:
                batch = batch.union(self.rm_wg.compute_rm_score(batch))
            scores, extra_infos = compute_reward(batch, self.reward_fn)
        batch.batch["token_level_scores"] = scores
        batch.non_tensor_batch.update({k: np.array(v) for k, v in extra_infos.items() if len(v) == len(batch)})
        return batch

    def train_step(self, batch: DataProto, metrics: dict, timing_raw: dict) -> DataProto:
        cfg = self.typed_config
        filter_cfg = cfg.algorithm.filter_groups
        if not filter_cfg.enable:
            batch = self._score(self._rollout(batch, metrics, timing_raw), timing_raw)
            metrics["train/num_gen_batches"] = 1
            metrics["train/gen_score/mean"] = float(batch.batch["token_level_scores"].sum(-1).double().mean())
            return self._learn(batch, metrics, timing_raw)

        sampler = DynamicSampler(train_batch_size=int(cfg.data.train_batch_size),
                                 n=int(cfg.actor_rollout_ref.rollout.n), metric=str(filter_cfg.metric),
                                 max_num_gen_batches=int(filter_cfg.max_num_gen_batches or 0))
        while not sampler.add(self._score(self._rollout(batch, metrics, timing_raw), timing_raw)):
            print(f"step {self.global_steps}: {sampler.kept_groups}/{sampler.train_batch_size} prompt groups kept "
                  f"after {sampler.num_gen_batches} generation rounds; generating more", flush=True)
            batch = self._next_round()
        metrics.update(sampler.metrics())
        return self._learn(sampler.batch(), metrics, timing_raw)


class DAPOTaskRunner(TaskRunner):
    """``main_ppo``'s TaskRunner (tokenizer, workers, reward managers, datasets) training a RayDAPOTrainer."""

    trainer_cls = RayDAPOTrainer
