"""Prompts in, scored samples out: the sampling half of the recipes that learn from their own generations
(rejection-sampling fine-tuning, on-policy distillation).

- :class:`PromptSource`: an RL prompt file (verl's parquet schema, ``RLHFDataset``) served as the batch of
  0-based step ``k`` (the same ``(seed, step)`` order as :func:`verl.trainer.recipe_driver.batch_indices`,
  so a resumed run sees the same prompts);
- :func:`sample_responses`: ``generate_sequences`` on a worker group (``rollout.n`` samples per prompt, the
  hybrid engine pushes new weights first), joined with the prompt rows and ``response_mask``;
- :func:`sequence_scores`: the configured reward manager's score of every sample (the sum of its token-level
  reward), and the manager's extra values;
- :func:`greedy_validation`: greedy answers to every prompt of a source, mean score per data source.
"""

from __future__ import annotations

import numpy as np
import torch

from verl.protocol import DataProto, pad_dataproto_to_divisor, unpad_dataproto
from verl.trainer.ppo.reward import compute_reward
from verl.trainer.recipe_driver import batch_indices
from verl.utils.dataset.rl_dataset import collate_fn, create_rl_dataset
from verl.utils.padding import response_attention_mask
from verl.workers.config.data import as_data_config

__all__ = ["PromptSource", "sample_responses", "sequence_scores"]

_GEN_KEYS = ("input_ids", "attention_mask", "position_ids")


class PromptSource:
    """``files`` as batches of prompts; ``batch(step)`` gives the rows of 0-based ``step``."""

    def __init__(self, files, tokenizer, data_cfg, batch_size: int, seed: int, max_samples: int = -1):
        self.dataset = create_rl_dataset(files, data_cfg, tokenizer, None, max_samples=max_samples)
        self.batch_size, self.seed = int(batch_size), int(seed)
        batch_indices(len(self.dataset), self.batch_size, self.seed, 0)  # a batch larger than the data fails here

    def __len__(self) -> int:
        return len(self.dataset)

    def rows(self, indices) -> DataProto:
        return DataProto.from_single_dict(collate_fn([self.dataset[i] for i in indices]))

    def batch(self, step: int) -> DataProto:
        return self.rows(batch_indices(len(self.dataset), self.batch_size, self.seed, step))


def prompt_sources(data_cfg, tokenizer, seed: int) -> tuple[PromptSource, PromptSource | None]:
    """``data.train_files`` in batches of ``data.train_batch_size`` prompts and ``data.val_files`` one prompt at a
    time (None when unset), each capped at ``data.train_max_samples`` / ``data.val_max_samples``."""
    typed = as_data_config(data_cfg)
    train = PromptSource(typed.train_files, tokenizer, data_cfg, typed.train_batch_size, seed,
                         int(typed.train_max_samples))
    val = (PromptSource(typed.val_files, tokenizer, data_cfg, 1, seed, int(typed.val_max_samples))
           if typed.val_files else None)
    return train, val


def sample_responses(group, prompts: DataProto, **meta) -> DataProto:
    """``prompts`` (each row repeated once per sample, interleaved) joined with their generated responses and
    ``response_mask``; ``meta`` goes to the rollout (``do_sample``, ``validate``, ...)."""
    gen = DataProto.from_dict(tensors={k: prompts.batch[k] for k in _GEN_KEYS},
                              meta_info={**prompts.meta_info, **meta})
    padded, pad = pad_dataproto_to_divisor(gen, group.world_size)
    out = group.generate_sequences(padded)
    per_prompt = len(out) // len(padded)
    out = unpad_dataproto(out, pad_size=pad * per_prompt)
    out.meta_info.pop("timing", None)
    for key, values in prompts.non_tensor_batch.items():  # data_source, reward_model, ... for the reward
        out.non_tensor_batch[key] = np.repeat(values, per_prompt)
    out.non_tensor_batch["prompt_row"] = np.repeat(np.arange(len(prompts)), per_prompt)
    out.batch["response_mask"] = response_attention_mask(out.batch)
    return out


def sequence_scores(reward_fn, samples: DataProto) -> tuple[torch.Tensor, dict]:
    """Per-sample score (B,) from ``reward_fn`` (a reward manager) and its extra values (lists per key)."""
    token_scores, extra = compute_reward(samples, reward_fn)
    return token_scores.sum(-1).float(), extra


def greedy_validation(group, source: PromptSource | None, reward_fn) -> dict:
    """Greedy answers to every prompt of ``source`` (e.g. ``data.val_files``), scored by ``reward_fn``:
    ``val-core/<data_source>/reward/mean@1`` per data source (``all`` when the rows name none)."""
    if source is None:
        return {}
    samples = sample_responses(group, source.rows(range(len(source))), validate=True)
    scores, _ = sequence_scores(reward_fn, samples)
    sources = samples.non_tensor_batch.get("data_source")
    metrics = {}
    for name in sorted(set(sources)) if sources is not None else ["all"]:
        rows = [i for i in range(len(scores)) if sources is None or sources[i] == name]
        metrics[f"val-core/{name}/reward/mean@1"] = float(scores[rows].mean())
    return metrics
