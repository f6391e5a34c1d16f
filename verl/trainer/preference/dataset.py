"""Preference data for DPO-family training and reward models, tokenized and checked up front.

Paired parquet (``PreferenceDataset``): ``prompt`` (a chat list ``[{"role", "content"}, ...]`` or a string),
``chosen`` and ``rejected`` (strings, or chat lists of the assistant turn(s)); optional ``margin`` (how much
better ``chosen`` was rated; Bradley-Terry with a margin). Unpaired parquet for KTO
(``UnpairedPreferenceDataset``): ``prompt``, ``completion``, ``label`` (true = desirable). Demonstrations for
self-play against the data (``ResponseDataset``, SPIN): ``prompt`` and a target ``response``.

Rendering: a chat prompt goes through the tokenizer's chat template with the generation prompt; a string
prompt is wrapped as one user turn (``data.apply_chat_template=False`` keeps it raw). A string response gets the
eos token appended; a chat-list response is the chat template's rendering of prompt + response minus the
rendering of the prompt.

Layout (the rollout's): ``[prompt left-padded to max_prompt_length | response right-padded to
max_response_length]`` with ``input_ids``, ``attention_mask``, ``position_ids``, ``responses``, ``response_mask``.
``pairs(indices)`` returns the interleaved ``[chosen_0, rejected_0, ...]`` batch of ``verl.trainer.preference``.

Checks (all before any training or writing): missing column, empty chosen/rejected/completion, chosen ==
rejected, response longer than ``max_response_length`` (``data.truncation=right`` cuts it instead) and prompt
longer than ``max_prompt_length`` -- an error naming the file and row, or, with
``data.filter_overlong_prompts=True``, a skip that is counted and logged.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from verl.protocol import DataProto
from verl.trainer.preference.pairs import interleave_pairs
from verl.utils.dataset.rl_dataset import _as_file_list, left_pad, read_parquet_rows
from verl.workers.config.data import PreferenceDataConfig, as_data_config

__all__ = ["PreferenceDataset", "UnpairedPreferenceDataset", "ResponseDataset", "PreferenceDataError",
           "mismatched_partners"]

logger = logging.getLogger(__name__)


class PreferenceDataError(ValueError):
    """A row of a preference file that cannot be trained on (the message names the file, row and fix)."""


def _right_pad(ids: list[int], length: int, pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    n_pad = length - len(ids)
    return (torch.tensor(list(ids) + [pad] * n_pad, dtype=torch.long),
            torch.tensor([1] * len(ids) + [0] * n_pad, dtype=torch.long))


class _Encoder:
    """Prompt and response rendering / tokenization shared by the paired and unpaired datasets."""

    def __init__(self, tokenizer, data: PreferenceDataConfig):
        self.tokenizer = tokenizer
        self.prompt_key = data.prompt_key
        self.max_prompt_length = data.max_prompt_length
        self.max_response_length = data.max_response_length
        self.truncation = data.truncation
        if self.truncation not in ("error", "right"):
            raise ValueError(f"data.truncation={self.truncation!r}: preference responses support error|right")
        self.filter_overlong_prompts = data.filter_overlong_prompts
        self.use_chat_template = data.apply_chat_template
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        if tokenizer.eos_token_id is None:
            raise ValueError("the tokenizer has no eos token; preference responses need one to end on")

    def messages(self, prompt: Any, where: str) -> list[dict] | None:
        if isinstance(prompt, str):
            return [{"role": "user", "content": prompt}] if self.use_chat_template else None
        if hasattr(prompt, "tolist"):
            prompt = prompt.tolist()
        if isinstance(prompt, (list, tuple)) and prompt and all(isinstance(m, dict) for m in prompt):
            return [dict(m) for m in prompt]
        raise PreferenceDataError(f"{where}: '{self.prompt_key}' must be a string or a list of "
                                  f"{{role, content}} messages, got {type(prompt).__name__}")

    def prompt_text(self, prompt: Any, where: str) -> str:
        msgs = self.messages(prompt, where)
        if msgs is None:
            return prompt
        return self.tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)

    def response_ids(self, prompt: Any, response: Any, key: str, where: str) -> list[int]:
        if hasattr(response, "tolist") and not isinstance(response, str):
            response = response.tolist()
        if isinstance(response, str):
            if not response.strip():
                raise PreferenceDataError(f"{where}: '{key}' is empty; every row needs a non-empty {key} response")
            ids = self.tokenizer(response, add_special_tokens=False)["input_ids"] + [self.tokenizer.eos_token_id]
        elif isinstance(response, (list, tuple)) and response and all(isinstance(m, dict) for m in response):
            if not any(str(m.get("content") or "").strip() for m in response):
                raise PreferenceDataError(f"{where}: '{key}' has no non-empty message content")
            msgs = self.messages(prompt, where) or [{"role": "user", "content": prompt}]
            head = self.tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
            full = self.tokenizer.apply_chat_template(msgs + [dict(m) for m in response], tokenize=False)
            if not full.startswith(head):
                raise PreferenceDataError(f"{where}: the chat template does not render '{key}' as a continuation "
                                          "of the prompt; pass the response as a string instead")
            ids = self.tokenizer(full[len(head):], add_special_tokens=False)["input_ids"]
        else:
            raise PreferenceDataError(f"{where}: '{key}' is missing or empty (got {response!r}); give a string or "
                                      "a list of assistant messages")
        if len(ids) > self.max_response_length:
            if self.truncation != "right":
                raise PreferenceDataError(
                    f"{where}: '{key}' has {len(ids)} tokens > data.max_response_length={self.max_response_length}; "
                    "raise data.max_response_length or set data.truncation=right")
            ids = ids[:self.max_response_length]
        return ids

    def encode(self, prompt_ids: list[int], response_ids: list[int]) -> dict[str, torch.Tensor]:
        p_ids, p_mask, _ = left_pad(prompt_ids, self.max_prompt_length, self.pad_id)
        r_ids, r_mask = _right_pad(response_ids, self.max_response_length, self.pad_id)
        mask = torch.cat([p_mask, r_mask])
        return {"input_ids": torch.cat([p_ids, r_ids]), "attention_mask": mask,
                "position_ids": torch.clamp(torch.cumsum(mask, 0) - 1, min=0), "responses": r_ids,
                "response_mask": r_mask.float()}


class _Base:
    """``config``: the ``data`` section (a DictConfig, a mapping with any subset of its keys, the others taking the
    schema's defaults, or a :class:`~verl.workers.config.data.PreferenceDataConfig`); ``self.data_config`` is it
    typed. ``self.keys`` maps each required column to its name in the files (``_columns``)."""

    required: tuple[str, ...] = ()

    @staticmethod
    def _columns(data: PreferenceDataConfig) -> dict[str, str]:
        raise NotImplementedError

    def __init__(self, data_files, tokenizer, config, max_samples: int = -1):
        self.data_config = data = as_data_config(config, PreferenceDataConfig)
        self.keys = self._columns(data)
        self.enc = _Encoder(tokenizer, data)
        self.tokenizer = tokenizer
        self.num_filtered = 0
        self.rows: list[dict] = []
        self.prompt_ids: list[list[int]] = []
        for path in _as_file_list(data_files):
            rows = read_parquet_rows(path)
            missing = [self._key(k) for k in self.required if self._key(k) not in rows[0]]
            if missing:
                raise PreferenceDataError(f"{path}: missing column(s) {missing}; a preference file needs "
                                          f"{[self._key(k) for k in self.required]} (columns: {sorted(rows[0])})")
            for i, row in enumerate(rows):
                self._add(row, f"{path} row {i}")
        if max_samples is not None and max_samples > 0:
            self.rows, self.prompt_ids = self.rows[:max_samples], self.prompt_ids[:max_samples]
            self._truncate(max_samples)
        if self.num_filtered:
            logger.warning("skipped %d row(s) whose prompt is longer than data.max_prompt_length=%d "
                           "(data.filter_overlong_prompts=True)", self.num_filtered, self.enc.max_prompt_length)
        if not self.rows:
            raise PreferenceDataError(f"no usable rows in {data_files} (skipped {self.num_filtered} overlong prompts)")

    def _key(self, name: str) -> str:
        return self.keys.get(name, name)

    def _prompt(self, row: dict, where: str) -> list[int] | None:
        text = self.enc.prompt_text(row[self.enc.prompt_key], where)
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        if not ids:
            raise PreferenceDataError(f"{where}: the prompt is empty")
        if len(ids) > self.enc.max_prompt_length:
            if self.enc.filter_overlong_prompts:
                self.num_filtered += 1
                return None
            raise PreferenceDataError(
                f"{where}: the prompt has {len(ids)} tokens > data.max_prompt_length={self.enc.max_prompt_length}; "
                "raise data.max_prompt_length or set data.filter_overlong_prompts=True to skip such rows")
        return ids

    def __len__(self) -> int:
        return len(self.rows)

    def prompts(self, indices) -> DataProto:
        """Left-padded prompts of ``indices`` for generation (``input_ids``, ``attention_mask``, ``position_ids``)."""
        parts = [left_pad(self.prompt_ids[i], self.enc.max_prompt_length, self.enc.pad_id) for i in indices]
        ids, mask, pos = (torch.stack(x) for x in zip(*parts))
        return DataProto.from_dict({"input_ids": ids, "attention_mask": mask, "position_ids": pos})


class PreferenceDataset(_Base):
    """Paired preferences; see the module docstring. ``config`` is the ``data`` section (``prompt_key``,
    ``chosen_key``, ``rejected_key``, ``max_prompt_length``, ``max_response_length``, ``truncation``,
    ``filter_overlong_prompts``, ``apply_chat_template``)."""

    required = ("prompt", "chosen", "rejected")

    @staticmethod
    def _columns(data: PreferenceDataConfig) -> dict[str, str]:
        return {"prompt": data.prompt_key, "chosen": data.chosen_key, "rejected": data.rejected_key}

    def __init__(self, data_files, tokenizer, config, max_samples: int = -1):
        self.chosen: list[list[int]] = []
        self.rejected: list[list[int]] = []
        self.margins: list[float] = []
        super().__init__(data_files, tokenizer, config, max_samples)

    def _add(self, row: dict, where: str) -> None:
        ck, rk = self._key("chosen"), self._key("rejected")
        prompt = row[self._key("prompt")]
        chosen = self.enc.response_ids(prompt, row.get(ck), ck, where)
        rejected = self.enc.response_ids(prompt, row.get(rk), rk, where)
        if chosen == rejected:
            raise PreferenceDataError(f"{where}: '{ck}' and '{rk}' are the same response; a pair must differ "
                                      "(drop the row or fix the data)")
        prompt_ids = self._prompt(row, where)
        if prompt_ids is None:
            return
        self.rows.append(row)
        self.prompt_ids.append(prompt_ids)
        self.chosen.append(chosen)
        self.rejected.append(rejected)
        self.margins.append(float(row.get("margin") or 0.0))

    def _truncate(self, n: int) -> None:
        self.chosen, self.rejected, self.margins = self.chosen[:n], self.rejected[:n], self.margins[:n]

    def _side(self, indices, responses) -> DataProto:
        rows = [self.enc.encode(self.prompt_ids[i], responses[i]) for i in indices]
        tensors = {k: torch.stack([r[k] for r in rows]) for k in rows[0]}
        return DataProto.from_dict(tensors)

    def pairs(self, indices) -> DataProto:
        """Interleaved ``[chosen_i, rejected_i, ...]`` rows of ``indices`` (``margin`` on every row)."""
        indices = list(indices)
        chosen, rejected = self._side(indices, self.chosen), self._side(indices, self.rejected)
        margin = torch.tensor([self.margins[i] for i in indices], dtype=torch.float32)
        chosen.batch["margin"] = margin
        rejected.batch["margin"] = margin.clone()
        return interleave_pairs(chosen, rejected)

    def chosen_texts(self, indices) -> list[str]:
        return [self.tokenizer.decode(self.chosen[i], skip_special_tokens=True) for i in indices]


def mismatched_partners(prompts: list) -> list[int]:
    """For KTO's reference point: for each row ``i``, the nearest earlier row (cyclically) whose prompt differs,
    so that prompt ``i`` paired with that row's completion is a mismatched (prompt, completion). ``prompts``
    holds one comparable key per row. Fixed by the file order, so precomputed reference log-probs and resumed
    runs see the same pairs."""
    n = len(prompts)
    partners = []
    for i in range(n):
        for back in range(1, n):
            j = (i - back) % n
            if prompts[j] != prompts[i]:
                partners.append(j)
                break
        else:
            raise PreferenceDataError("every row has the same prompt; KTO estimates its reference point from a "
                                      "prompt paired with another prompt's completion, so it needs >= 2 prompts")
    return partners


class UnpairedPreferenceDataset(_Base):
    """KTO data: ``prompt``, ``completion``, ``label`` (true: desirable). ``batch(indices)`` carries ``label``;
    ``pairs(indices)`` interleaves each row with its mismatched row ``[y_0, y'_0, y_1, y'_1, ...]`` (``y'_i``:
    prompt ``i`` with the completion of ``mismatched_partners``' row), the layout ``KTOLoss`` reads. Both
    labels must occur (an error naming the column otherwise)."""

    required = ("prompt", "completion", "label")

    @staticmethod
    def _columns(data: PreferenceDataConfig) -> dict[str, str]:
        return {"prompt": data.prompt_key, "completion": data.completion_key, "label": data.label_key}

    def __init__(self, data_files, tokenizer, config, max_samples: int = -1):
        self.completions: list[list[int]] = []
        self.labels: list[bool] = []
        super().__init__(data_files, tokenizer, config, max_samples)
        n_good = sum(self.labels)
        if n_good in (0, len(self.labels)):
            kind = "true (desirable)" if n_good else "false (undesirable)"
            raise PreferenceDataError(
                f"{data_files}: every row has '{self._key('label')}' = {kind}; KTO needs both desirable (true) and "
                "undesirable (false) completions")
        self.partners = mismatched_partners([tuple(p) for p in self.prompt_ids])

    def _add(self, row: dict, where: str) -> None:
        key, lk = self._key("completion"), self._key("label")
        completion = self.enc.response_ids(row[self._key("prompt")], row.get(key), key, where)
        label = row.get(lk)
        if label is None or str(label).lower() not in ("true", "false", "1", "0"):
            raise PreferenceDataError(f"{where}: '{lk}' must be true/false (desirable or not), got {label!r}")
        prompt_ids = self._prompt(row, where)
        if prompt_ids is None:
            return
        self.rows.append(row)
        self.prompt_ids.append(prompt_ids)
        self.completions.append(completion)
        self.labels.append(str(label).lower() in ("true", "1"))

    def _truncate(self, n: int) -> None:
        self.completions, self.labels = self.completions[:n], self.labels[:n]

    def _rows(self, indices, completions) -> DataProto:
        rows = [self.enc.encode(self.prompt_ids[i], c) for i, c in zip(indices, completions)]
        tensors = {k: torch.stack([r[k] for r in rows]) for k in rows[0]}
        tensors["label"] = torch.tensor([self.labels[i] for i in indices], dtype=torch.float32)
        return DataProto.from_dict(tensors)

    def batch(self, indices) -> DataProto:
        indices = list(indices)
        return self._rows(indices, [self.completions[i] for i in indices])

    def pairs(self, indices) -> DataProto:
        """Interleaved ``[y_i, y'_i, ...]`` rows of ``indices`` (``y'_i`` carries row ``i``'s label too)."""
        indices = list(indices)
        mismatched = self._rows(indices, [self.completions[self.partners[i]] for i in indices])
        return interleave_pairs(self.batch(indices), mismatched)

    def desirable_texts(self, indices) -> list[set[str]]:
        """For each row, the texts of all desirable completions of its prompt in this dataset."""
        by_prompt: dict[tuple, set[str]] = {}
        for ids, comp, good in zip(self.prompt_ids, self.completions, self.labels):
            if good:
                by_prompt.setdefault(tuple(ids), set()).add(
                    self.tokenizer.decode(comp, skip_special_tokens=True).strip())
        return [by_prompt.get(tuple(self.prompt_ids[i]), set()) for i in indices]


class ResponseDataset(_Base):
    """Prompts with one target response each (``data.response_key``), e.g. SFT data.
    ``targets(indices)`` gives the prompt + target rows in the rollout's layout, ``prompts(indices)`` the prompts
    alone for generation."""

    required = ("prompt", "response")

    @staticmethod
    def _columns(data: PreferenceDataConfig) -> dict[str, str]:
        return {"prompt": data.prompt_key, "response": data.response_key}

    def __init__(self, data_files, tokenizer, config, max_samples: int = -1):
        self.responses: list[list[int]] = []
        super().__init__(data_files, tokenizer, config, max_samples)

    def _add(self, row: dict, where: str) -> None:
        key = self._key("response")
        response = self.enc.response_ids(row[self._key("prompt")], row.get(key), key, where)
        prompt_ids = self._prompt(row, where)
        if prompt_ids is None:
            return
        self.rows.append(row)
        self.prompt_ids.append(prompt_ids)
        self.responses.append(response)

    def _truncate(self, n: int) -> None:
        self.responses = self.responses[:n]

    def targets(self, indices) -> DataProto:
        rows = [self.enc.encode(self.prompt_ids[i], self.responses[i]) for i in indices]
        return DataProto.from_dict({k: torch.stack([r[k] for r in rows]) for k in rows[0]})

    def target_texts(self, indices) -> list[str]:
        return [self.tokenizer.decode(self.responses[i], skip_special_tokens=True) for i in indices]
