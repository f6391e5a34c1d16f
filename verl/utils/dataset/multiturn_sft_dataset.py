"""Multi-turn SFT dataset (verl's ``MultiTurnSFTDataset``): a column of chat messages per row.

The conversation is rendered with the chat template; the loss is taken on assistant turns only. For each
assistant message the trained span is what the model must produce after the generation prompt
(``<|im_start|>assistant\\n`` for Qwen-style templates): its content and the end-of-turn token; template text
after the end-of-turn token (e.g. a newline) is not trained. Items have the same layout as ``SFTDataset``:
``input_ids, attention_mask, position_ids, loss_mask`` of length ``data.max_length``, right-padded, with
``loss_mask[t] == 1`` exactly when token ``t`` is a trained assistant token.

Config keys (the ``data`` section of sft_trainer.yaml, as for ``SFTDataset``): multiturn.messages_key,
max_length, truncation (error|left|right), chat_template.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from verl.utils.dataset.sft_dataset import _SFTBase, load_rows, pack_sft_item


class MultiTurnSFTDataset(_SFTBase):
    def __init__(self, parquet_files, tokenizer, config, max_samples: int = -1):
        super().__init__(tokenizer, config, max_samples)
        self.messages_key = self.data_config.multiturn.messages_key
        key_name = "data.multiturn.messages_key"
        self.rows, self.origins = load_rows(parquet_files, [(self.messages_key, key_name)], self.max_samples)

    def _segments(self, messages: list[dict], where: str) -> list[tuple[str, bool]]:
        """The rendered conversation cut into (text, is_trained) pieces, in order."""
        full = self.render(messages, add_generation_prompt=False)
        pieces, pos = [], 0
        for i, message in enumerate(messages):
            if message.get("role") != "assistant":
                continue
            start_text = self.render(messages[:i], add_generation_prompt=True) if i else ""
            end_text = self.render(messages[: i + 1], add_generation_prompt=False)
            if not (full.startswith(start_text) and full.startswith(end_text) and len(start_text) >= pos):
                raise ValueError(
                    f"the chat template does not render the conversation in {where} as a sequence of prefixes, "
                    "so assistant tokens cannot be located; set data.chat_template to a template that does"
                )
            pieces.append((full[pos : len(start_text)], False))
            pieces.append((full[len(start_text) : len(end_text)], True))
            pos = len(end_text)
        pieces.append((full[pos:], False))
        return pieces

    def __getitem__(self, item: int) -> dict[str, Any]:
        where = self._where(item)
        messages = self.rows[item][self.messages_key]
        if isinstance(messages, np.ndarray):
            messages = messages.tolist()
        if not isinstance(messages, list) or not all(isinstance(m, dict) and "role" in m for m in messages):
            raise ValueError(f"{self.messages_key!r} in {where} must be a list of {{'role', 'content'}} messages")
        if not any(m["role"] == "assistant" for m in messages):
            raise ValueError(f"conversation in {where} has no assistant message, so nothing would be trained")
        eos = self.tokenizer.eos_token_id
        ids, mask = [], []
        for text, trained in self._segments(messages, where):
            seg = self.encode(text)
            seg_mask = [int(trained)] * len(seg)
            if trained and eos in seg:  # stop training after the end-of-turn token
                cut = seg.index(eos) + 1
                seg_mask = [1] * cut + [0] * (len(seg) - cut)
            ids += seg
            mask += seg_mask
        return pack_sft_item(ids, mask, self.max_length, self.tokenizer.pad_token_id, self.truncation, where)
