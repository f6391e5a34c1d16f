"""The validation half of :class:`verl.trainer.ppo.ray_trainer.RayPPOTrainer`: greedy generation over the
validation set, verl's ``val-core`` / ``val-aux`` metric names, and the optional generation logs and dumps
(``trainer.log_val_generations``, ``trainer.validation_data_dir``, ``trainer.rollout_data_dir``).

The mixin reads the trainer's ``config``, ``tokenizer``, ``val_dataloader``, ``val_reward_fn``, ``logger``,
``validation_generations_logger`` and ``global_steps``, and calls its ``_pop_gen_batch`` / ``_generate``.
"""

from __future__ import annotations

import numpy as np
import torch

from verl.protocol import DataProto
from verl.trainer.ppo.metric_utils import process_validation_metrics
from verl.trainer.ppo.reward import compute_reward
from verl.trainer.ppo.utils import dump_generations
from verl.utils.timer import marked_timer

__all__ = ["ValidationMixin"]


class ValidationMixin:
    def _validate(self) -> dict[str, float]:
        """Greedy (``rollout.val_kwargs``) generation over the validation set, scored by ``val_reward_fn``."""
        val_kwargs = self.typed_config.actor_rollout_ref.rollout.val_kwargs
        n_val = int(val_kwargs.n)
        inputs, outputs, scores, data_sources = [], [], [], []
        extra_infos: dict[str, list] = {"reward": []}
        for test_data in self.val_dataloader:
            test_batch = DataProto.from_single_dict(test_data)
            test_batch = test_batch.repeat(repeat_times=n_val, interleave=True)
            inputs.extend(self._decode(test_batch.batch["input_ids"]))
            gen_batch = self._pop_gen_batch(test_batch)
            gen_batch.meta_info.update({
                "eos_token_id": self.tokenizer.eos_token_id,
                "pad_token_id": self.tokenizer.pad_token_id,
                "recompute_log_prob": False,
                "do_sample": bool(val_kwargs.do_sample),
                "validate": True,
            })
            output = self._generate(gen_batch)
            outputs.extend(self._decode(output.batch["responses"]))
            test_batch = test_batch.union(output)
            test_batch.meta_info["validate"] = True
            reward_tensor, infos = compute_reward(test_batch, self.val_reward_fn)
            batch_scores = reward_tensor.sum(-1).cpu().tolist()
            scores.extend(batch_scores)
            extra_infos["reward"].extend(batch_scores)
            for key, values in infos.items():
                if len(values) == len(batch_scores):
                    extra_infos.setdefault(key, []).extend(values)
            data_sources.append(test_batch.non_tensor_batch.get("data_source", np.array(["unknown"] * len(batch_scores), dtype=object)))

        self._maybe_log_val_generations(inputs, outputs, scores)
        val_dir = self.typed_config.trainer.validation_data_dir
        if val_dir:
            dump_generations(inputs, outputs, scores, extra_infos, val_dir, self.global_steps)
        extra_infos = {k: v for k, v in extra_infos.items() if len(v) == len(scores)}
        per_source = process_validation_metrics(np.concatenate(data_sources, axis=0), inputs, extra_infos)
        return _val_metric_names(per_source)

    def _decode(self, ids: torch.Tensor) -> list[str]:
        return [self.tokenizer.decode(row, skip_special_tokens=True) for row in ids]

    def _maybe_log_val_generations(self, inputs, outputs, scores) -> None:
        n = int(self.typed_config.trainer.log_val_generations or 0)
        if n <= 0 or self.logger is None:
            return
        samples = sorted(zip(inputs, outputs, scores), key=lambda x: x[0])
        np.random.RandomState(42).shuffle(samples)
        loggers = self.typed_config.trainer.logger
        loggers = [loggers] if isinstance(loggers, str) else list(loggers)
        self.validation_generations_logger.log(loggers, samples[:n], self.global_steps,
                                               tracker=self.logger)

    def _maybe_dump_rollouts(self, batch: DataProto, timing_raw: dict) -> None:
        path = self.typed_config.trainer.rollout_data_dir
        if not path:
            return
        with marked_timer("dump_rollout_generations", timing_raw):
            inputs = self._decode(batch.batch["prompts"])
            outputs = self._decode(batch.batch["responses"])
            scores = batch.batch["token_level_scores"].sum(-1).cpu().tolist()
            extra = {k: list(v) for k, v in batch.non_tensor_batch.items() if k in ("uid", "data_source", "acc")}
            dump_generations(inputs, outputs, scores, extra, path, self.global_steps)


def _val_metric_names(per_source: dict) -> dict[str, float]:
    """verl's layout: ``val-core/<source>/<var>/<metric>`` for the headline metric (mean/maj/best at the
    largest N of ``acc`` if present, else ``reward``), ``val-aux/...`` for the rest."""
    out = {}
    for source, var2metric in per_source.items():
        core_var = "acc" if "acc" in var2metric else "reward"
        for var_name, metric2val in var2metric.items():
            n_max = max(int(name.split("@")[-1].split("/")[0]) for name in metric2val)
            for metric_name, value in metric2val.items():
                core = (var_name == core_var and metric_name.startswith(("mean", "maj", "best"))
                        and f"@{n_max}" in metric_name)
                out[f"{'val-core' if core else 'val-aux'}/{source}/{var_name}/{metric_name}"] = value
    return out
