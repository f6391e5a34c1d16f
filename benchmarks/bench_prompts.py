"""Prompt batches shared by the benchmark scripts: left-padded arithmetic prompts as a rollout input DataProto."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from verl.protocol import DataProto  # noqa: E402
from verl.utils.model import compute_position_id_with_mask  # noqa: E402


def left_padded_prompts(tokenizer, texts: list[str]) -> DataProto:
    """``input_ids`` / ``attention_mask`` / ``position_ids`` of ``texts``, left-padded as the rollout expects."""
    tokenizer.padding_side = "left"
    enc = tokenizer(list(texts), return_tensors="pt", padding=True)
    mask = enc["attention_mask"]
    return DataProto.from_dict({"input_ids": enc["input_ids"], "attention_mask": mask,
                                "position_ids": compute_position_id_with_mask(mask)})
