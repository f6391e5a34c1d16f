"""Single-turn SFT dataset (verl's ``SFTDataset``): a prompt column and a response column.

The prompt is rendered with the chat template as one user turn plus the generation prompt (exactly what the
RL rollout sees); the response is followed by the tokenizer's eos token. Each item holds 1-D int64 tensors of
length ``data.max_length``, right-padded:

    input_ids, attention_mask, position_ids, loss_mask

``loss_mask[t] == 1`` exactly when token ``t`` is a response token (the eos included), i.e. it is aligned with
the tokens themselves: the trainer weights the loss of predicting ``input_ids[:, 1:]`` with ``loss_mask[:, 1:]``.

Config keys (the ``data`` section of sft_trainer.yaml): prompt_key, response_key, prompt_dict_keys,
response_dict_keys (walk into dict-valued columns), max_length, truncation (error|left|right), chat_template.
``config`` may be a DictConfig, a mapping with any subset of the keys (the others take the schema's defaults) or a
:class:`~verl.workers.config.data.SFTDataConfig`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from verl.utils.dataset.rl_dataset import _as_file_list, read_parquet_rows
from verl.workers.config.data import SFTDataConfig, as_data_config


def load_rows(files, required: list[str], max_samples: int = -1) -> tuple[list[dict], list[tuple[str, int]]]:
    """Rows of all files, checking that every file has the ``required`` columns (named by their config key)."""
    rows, origins = [], []
    for path in _as_file_list(files):
        file_rows = read_parquet_rows(path)
        for column, key in required:
            if column not in file_rows[0]:
                raise KeyError(
                    f"data file {path} has no column {column!r} ({key}); its columns are {sorted(file_rows[0])}; "
                    f"set {key} to the right column"
                )
        rows.extend(file_rows)
        origins.extend((path, i) for i in range(len(file_rows)))
    if max_samples is not None and 0 < max_samples < len(rows):
        rows, origins = rows[:max_samples], origins[:max_samples]
    return rows, origins


def pack_sft_item(
    ids: list[int], mask: list[int], max_length: int, pad_token_id: int, truncation: str, where: str
) -> dict[str, torch.Tensor]:
    """Truncate (left/right) or reject an over-long sequence, then right-pad to ``max_length``."""
    if len(ids) > max_length:
        if truncation == "left":
            ids, mask = ids[-max_length:], mask[-max_length:]
        elif truncation == "right":
            ids, mask = ids[:max_length], mask[:max_length]
        else:
            raise ValueError(
                f"sample in {where} is {len(ids)} tokens, longer than data.max_length={max_length}; "
                "set data.truncation=left|right or raise data.max_length"
            )
    n_pad = max_length - len(ids)
    attention_mask = torch.tensor([1] * len(ids) + [0] * n_pad, dtype=torch.long)
    return {
        "input_ids": torch.tensor(list(ids) + [pad_token_id] * n_pad, dtype=torch.long),
        "attention_mask": attention_mask,
        "position_ids": torch.clamp(torch.cumsum(attention_mask, dim=0) - 1, min=0),
        "loss_mask": torch.tensor(list(mask) + [0] * n_pad, dtype=torch.long),
    }


class _SFTBase(Dataset):
    def __init__(self, tokenizer, config, max_samples: int):
        self.tokenizer = tokenizer
        self.config = config  # as given: a subclass may read keys of its own from it
        self.data_config = data = as_data_config(config, SFTDataConfig)
        self.max_length = data.max_length
        self.truncation = data.truncation
        self.chat_template = data.chat_template
        self.max_samples = -1 if max_samples is None else int(max_samples)
        if tokenizer.pad_token_id is None:
            raise ValueError("the tokenizer has no pad token; set tokenizer.pad_token (e.g. to its eos token)")
        if self.chat_template is None and not getattr(tokenizer, "chat_template", None):
            raise ValueError(
                "the tokenizer has no chat template; use a chat model's tokenizer or set data.chat_template"
            )

    def render(self, messages: list[dict], add_generation_prompt: bool) -> str:
        kwargs = {} if self.chat_template is None else {"chat_template": self.chat_template}
        return self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=add_generation_prompt, tokenize=False, **kwargs
        )

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False) if text else []

    def _where(self, item: int) -> str:
        path, row = self.origins[item]
        return f"row {row} of {path}"

    def __len__(self) -> int:
        return len(self.rows)


def _unwrap(value):
    """A one-element list or array around a value (how some parquet writers store a struct) is the value."""
    while isinstance(value, (list, tuple, np.ndarray)) and len(value) == 1:
        value = value[0]
    return value


def _dig(value, keys, column: str, where: str, dict_key: str = "data.*_dict_keys"):
    """``value[keys[0]][keys[1]]...``: the text inside a dict-valued column (verl's ``prompt_dict_keys`` /
    ``response_dict_keys``, e.g. ``extra_info`` -> ``answer`` in verl's gsm8k files)."""
    for key in keys or []:
        value = _unwrap(value)
        if not isinstance(value, dict):
            raise KeyError(f"{column!r} in {where} is a {type(value).__name__}, not a dict, so {dict_key}="
                           f"{list(keys)} cannot look up {key!r}; set {dict_key}=null for a plain text column")
        if key not in value:
            raise KeyError(f"{column!r} in {where} has no key {key!r} ({dict_key}={list(keys)}); its keys are "
                           f"{sorted(value)}")
        value = value[key]
    return _unwrap(value) if keys else value


class SFTDataset(_SFTBase):
    """Prompt/response pairs from parquet files; see the module docstring for the item layout."""

    def __init__(self, parquet_files, tokenizer, config, max_samples: int = -1):
        super().__init__(tokenizer, config, max_samples)
        data = self.data_config
        self.prompt_key = data.prompt_key
        self.response_key = data.response_key
        self.prompt_dict_keys = list(data.prompt_dict_keys or [])
        self.response_dict_keys = list(data.response_dict_keys or [])
        if tokenizer.eos_token is None:
            raise ValueError("the tokenizer has no eos token; SFT appends it to every response")
        self.rows, self.origins = load_rows(
            parquet_files,
            [(self.prompt_key, "data.prompt_key"), (self.response_key, "data.response_key")],
            self.max_samples,
        )

    def __getitem__(self, item: int) -> dict[str, Any]:
        row, where = self.rows[item], self._where(item)
        prompt = _dig(row[self.prompt_key], self.prompt_dict_keys, self.prompt_key, where, "data.prompt_dict_keys")
        response = _dig(row[self.response_key], self.response_dict_keys, self.response_key, where,
                        "data.response_dict_keys")
        if isinstance(response, (dict, list, np.ndarray)):
            raise ValueError(f"the response in {where} ({self.response_key!r}) is a {type(response).__name__}, not "
                             "text; point data.response_dict_keys at the text inside it (e.g. "
                             "data.response_dict_keys=[answer])")
        if isinstance(prompt, np.ndarray):
            prompt = prompt.tolist()
        messages = prompt if isinstance(prompt, list) else [{"role": "user", "content": str(prompt)}]
        prompt_ids = self.encode(self.render(messages, add_generation_prompt=True))
        response_ids = self.encode(str(response) + self.tokenizer.eos_token)
        return pack_sft_item(
            prompt_ids + response_ids,
            [0] * len(prompt_ids) + [1] * len(response_ids),
            self.max_length,
            self.tokenizer.pad_token_id,
            self.truncation,
            where,
        )
