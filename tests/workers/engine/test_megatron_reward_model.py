"""A sequence-classification reward model on the Megatron engine (``reward_model.strategy=megatron``).

A tiny ``Qwen2ForSequenceClassification`` (num_labels=1, ``score.weight``) runs forward-only on the Megatron engine
with TP=1, TP=2 (sequence parallel) and PP=2 over two gloo processes. Its ``scores`` output (the head at every
column of ``input_ids``) must equal the HF model's head over its last hidden states at every valid position, and
the score the reward-model worker reads (the last valid token, ``argmax(position_ids * attention_mask)``) must equal
the HF model's own pooled logit, within 1e-5.
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "actor"))
from engine_testlib import make_batch, run_distributed, tiny_config  # noqa: E402

from verl.workers.engine import MicroBatchSpec  # noqa: E402
from verl.workers.engine.config import EngineConfig  # noqa: E402

pytest.importorskip("megatron.core")

TOL = 1e-5


def _rm_dir(path: str) -> str:
    from transformers import Qwen2ForSequenceClassification

    torch.manual_seed(0)
    cfg = tiny_config(tie=False)
    cfg.num_labels = 1
    cfg.architectures = ["Qwen2ForSequenceClassification"]
    Qwen2ForSequenceClassification(cfg).float().save_pretrained(path)
    return path


def _rank(rank, world, model_dir, out_dir, tp, pp):
    from verl.protocol import DataProto
    from verl.workers.engine import get_engine_cls

    cfg = EngineConfig(model_path=model_dir, name="reward_model", strategy="megatron", model_kind="reward",
                       megatron={"tensor_model_parallel_size": tp, "pipeline_model_parallel_size": pp})
    engine = get_engine_cls("megatron").build(cfg)
    assert engine.optimizer is None  # forward-only
    data = DataProto.from_dict(make_batch(bsz=4, prompt_len=6, resp_len=5, with_ref=False))
    scores = engine.infer(data, ("scores",), MicroBatchSpec(micro_batch_size=2))["scores"]
    if engine.is_output_rank:
        torch.save(scores, os.path.join(out_dir, "scores.pt"))


@pytest.mark.parametrize("tp,pp", [(1, 1), (2, 1), (1, 2)], ids=["tp1", "tp2", "pp2"])
def test_reward_model_scores_match_hf(tmp_path, tp, pp):
    from transformers import AutoModelForSequenceClassification

    model_dir = _rm_dir(str(tmp_path / "rm"))
    run_distributed(_rank, 2, model_dir, str(tmp_path), tp, pp, err_dir=str(tmp_path))
    scores = torch.load(tmp_path / "scores.pt")

    batch = make_batch(bsz=4, prompt_len=6, resp_len=5, with_ref=False)
    hf = AutoModelForSequenceClassification.from_pretrained(model_dir, dtype=torch.float32).eval()
    mask, pos = batch["attention_mask"], batch["position_ids"]
    with torch.no_grad():
        hidden = hf.model(input_ids=batch["input_ids"], attention_mask=mask, position_ids=pos).last_hidden_state
        per_token = hf.score(hidden)[..., 0]
        pooled = hf(input_ids=batch["input_ids"], attention_mask=mask, position_ids=pos).logits[:, 0]
    assert scores.shape == per_token.shape
    valid = mask.bool()
    assert (scores - per_token)[valid].abs().max() < TOL
    assert not scores[~valid].any()  # padding columns hold zeros
    last = torch.argmax(pos * mask, dim=-1)  # the column the reward-model worker reads
    assert (scores[torch.arange(4), last] - pooled).abs().max() < TOL
    assert pooled.abs().min() > 0  # a head that was not loaded would give zeros
