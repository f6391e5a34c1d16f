"""Rejection-sampling fine-tuning, pure parts: the SFT loss against a float64 hand computation, best-of-n
selection on hand-made score groups, the SFT batch padding, and config errors that name their key."""

import math
import re

import pytest
import torch
from omegaconf import OmegaConf

from recipe.rejection_sampling.main_rejection_sampling import (RejectionSamplingTrainer, SFTLoss, check_config,
                                                               select_accepted)
from verl.protocol import DataProto
from verl.utils.config import ConfigError


def test_sft_loss_is_the_token_mean_nll():
    g = torch.Generator().manual_seed(0)
    log_probs = -torch.rand(3, 4, generator=g, dtype=torch.float64) * 3
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1]], dtype=torch.float64)
    loss, metrics = SFTLoss()({"log_probs": log_probs}, {"response_mask": mask})
    terms = [-log_probs[i, t].item() for i in range(3) for t in range(4) if mask[i, t]]
    assert loss.item() == pytest.approx(sum(terms) / len(terms), rel=1e-12)
    assert metrics["actor/sft_loss"].item() == pytest.approx(loss.item())
    empty, _ = SFTLoss()({"log_probs": log_probs}, {"response_mask": torch.zeros_like(mask)})
    assert empty.item() == 0.0  # a padding-only micro-batch adds nothing


@pytest.mark.parametrize("scores, n, min_score, keep, want", [
    ([0, 1, 1, 0, 0, 0, 0, 0], 4, 1.0, 1, [1]),                 # first of the tied best; prompt 2 has none
    ([0.2, 0.9, 0.5, 1.0, 0.7, 0.1], 3, 0.5, 2, [1, 2, 3, 4]),  # two best at or above 0.5 per prompt
    ([0.2, 0.9, 0.5, 1.0, 0.7, 0.1], 3, 0.8, 2, [1, 3]),         # the bar leaves one per prompt
    ([0.3, 0.1], 1, -1.0, 1, [0, 1]),                            # n = 1: every sample above the bar
    ([0.0, 0.0, 0.0], 3, 0.5, 1, []),                            # nothing accepted
])
def test_select_accepted(scores, n, min_score, keep, want):
    assert select_accepted(torch.tensor(scores), n, min_score, keep) == want


def test_select_accepted_rejects_ragged_groups():
    with pytest.raises(ValueError, match="groups of n=4"):
        select_accepted(torch.zeros(6), 4, 0.0, 1)


def _config(**rs):
    base = {"min_score": 1.0, "keep_per_prompt": 1, "sft_epochs": 1, "sft_mini_batch_size": 8,
            "micro_batch_size_per_gpu": 8}
    return OmegaConf.create({"rejection_sampling": {**base, **rs},
                             "actor_rollout_ref": {"rollout": {"n": 4, "do_sample": True}}})


@pytest.mark.parametrize("override, message", [
    ({"keep_per_prompt": 5}, "rejection_sampling.keep_per_prompt=5"),
    ({"keep_per_prompt": 0}, "rejection_sampling.keep_per_prompt=0"),
    ({"min_score": "high"}, "rejection_sampling.min_score='high'"),
    ({"sft_epochs": 0}, "rejection_sampling.sft_epochs=0"),
    ({"micro_batch_size_per_gpu": 0}, "rejection_sampling.micro_batch_size_per_gpu=0"),
])
def test_config_errors_name_the_key(override, message):
    check_config(_config())
    with pytest.raises(ConfigError, match=re.escape(message)):
        check_config(_config(**override))


def test_greedy_best_of_n_is_refused():
    cfg = _config()
    cfg.actor_rollout_ref.rollout.do_sample = False
    with pytest.raises(ConfigError, match="actor_rollout_ref.rollout.do_sample=false"):
        check_config(cfg)


def test_sft_batch_pads_with_maskless_rows():
    trainer = RejectionSamplingTrainer.__new__(RejectionSamplingTrainer)
    trainer.config = _config(sft_mini_batch_size=4, micro_batch_size_per_gpu=2)
    trainer.world, trainer.seed, trainer.global_steps = 2, 0, 3
    rows = {k: torch.ones(3, 5, dtype=torch.long) for k in ("input_ids", "attention_mask", "position_ids")}
    rows.update(responses=torch.ones(3, 2, dtype=torch.long), response_mask=torch.ones(3, 2, dtype=torch.long))
    batch = trainer.sft_batch(DataProto.from_dict(rows))
    assert len(batch) == 4 and batch.batch["response_mask"].sum().item() == 6  # one filler row, mask 0
    spec = batch.meta_info["train_spec"]
    assert (spec.mini_batch_size, spec.micro.micro_batch_size, spec.weight_by, spec.seed) == (2, 2, "tokens", 3)
    assert math.isclose(batch.batch["response_mask"][3].sum().item(), 0)
