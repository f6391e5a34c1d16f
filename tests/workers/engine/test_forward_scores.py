"""A reward model's per-position scores with ``use_remove_padding`` (trimmed columns or one packed row) equal the
padded forward's at every valid position, and each row's score at its last valid token equals the score of that
sequence alone (what the reward model worker reads)."""

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "actor"))
from engine_testlib import make_batch, tiny_config  # noqa: E402

from verl.workers.engine.hf_forward import forward_scores  # noqa: E402


@pytest.fixture(scope="module")
def reward_model():
    from transformers import Qwen2ForSequenceClassification

    torch.manual_seed(0)
    cfg = tiny_config()
    cfg.num_labels = 1
    cfg._attn_implementation = "sdpa"
    return Qwen2ForSequenceClassification(cfg).double().eval()


@pytest.mark.parametrize("mode", ["trim", "pack"])
def test_scores_without_padding_match_the_padded_forward(reward_model, monkeypatch, mode):
    monkeypatch.setenv("VERL_REMOVE_PADDING_MODE", mode)
    batch = make_batch(bsz=5, prompt_len=7, resp_len=6, seed=1)
    # a column of padding in every row, which trimming removes
    for key in ("input_ids", "attention_mask", "position_ids"):
        batch[key] = torch.cat([torch.zeros_like(batch[key][:, :2]), batch[key]], dim=1)
    mask = batch["attention_mask"].bool()
    with torch.no_grad():
        padded = forward_scores(reward_model, batch)
        unpadded = forward_scores(reward_model, batch, use_remove_padding=True)
    assert unpadded.shape == padded.shape
    torch.testing.assert_close(unpadded[mask], padded[mask], rtol=1e-6, atol=1e-7)
    assert torch.all(unpadded[:, :2] == 0)  # the all-padding columns were not computed
    last = torch.argmax(batch["position_ids"] * batch["attention_mask"], dim=-1)
    for row in range(mask.shape[0]):
        ids = batch["input_ids"][row][mask[row]].unsqueeze(0)
        with torch.no_grad():
            alone = reward_model(input_ids=ids).logits[0, 0]
        torch.testing.assert_close(unpadded[row, last[row]], alone.float(), rtol=1e-6, atol=1e-7)
