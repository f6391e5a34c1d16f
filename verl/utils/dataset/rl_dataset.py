"""The RL prompt dataset (verl's ``RLHFDataset``) and the helpers the trainer builds it with.

Rows follow verl's parquet schema: a chat list under ``data.prompt_key`` (default ``prompt``) plus any other
columns (``data_source``, ``reward_model``, ``extra_info``, ...), which are passed through unchanged.
Each item is one prompt rendered with the tokenizer's chat template (``add_generation_prompt=True``) and
left-padded to ``data.max_prompt_length``:

    input_ids, attention_mask, position_ids   1-D int64 tensors of length max_prompt_length
    raw_prompt_ids                            the unpadded token ids (list of int)
    raw_prompt                                the chat list            (data.return_raw_chat=True)
    full_prompts                              the rendered string      (data.return_full_prompt=True)
    index                                     extra_info["index"], else the row number
    tools_kwargs / interaction_kwargs         extra_info["tools_kwargs"] / ["interaction_kwargs"] ({} if absent)
    <every other column of the row>

Images (with a vision-language model's processor, ``verl.utils.hf_processor``): the column ``data.image_key``
(default ``images``) holds a list of images (PIL images or ``{"bytes": ...}`` dicts, as ``datasets`` stores them)
and each ``<image>`` in the prompt text marks where the next one goes (the counts must match). Such a row is
rendered and tokenized by the processor and also gives

    multi_modal_data                          {"image": [PIL images]}   (what vLLM takes)
    multi_modal_inputs                        the processor's pixel_values, image_grid_thw
                                              (with data.return_multi_modal_inputs=True)
    position_ids                              (3, max_prompt_length): Qwen2-VL's 3-D rotary positions
    raw_prompt_ids                            the prompt ids with one ``<|image_pad|>`` per image (vLLM expands it)

and ``collate_fn`` adds the padded tensors ``mm_pixel_values`` / ``mm_image_grid_thw`` that carry the images
through the trainer's batches (see ``verl.utils.dataset.vision_utils``).

Prompts longer than ``max_prompt_length`` are dropped up front (``data.filter_overlong_prompts=True``) or cut
according to ``data.truncation``: ``left`` keeps the end, ``right`` the start, ``middle`` both ends, ``error``
raises naming the file and row. The filter measures the prompt as the agent loop renders it: with
``data.tool_config_path`` (it follows ``actor_rollout_ref.rollout.multi_turn.tool_config_path``) the tools'
schemas go into the chat template. ``data.filter_overlong_prompts_workers > 1`` measures the rows in that many
forked processes (large datasets; the kept rows are the same).
"""

from __future__ import annotations

import copy
import inspect
import logging
import multiprocessing
import os
import re
from collections import defaultdict
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from torch.utils.data import Dataset

from verl.tools.utils.tool_registry import initialize_tools_from_config, tool_schemas
from verl.trainer.config_schema.ppo import TRUNCATIONS
from verl.utils.dataset.dataloader import make_random_sampler, make_sequential_sampler
from verl.utils.dataset.vision_utils import decode_image, mrope_position_ids, pad_multi_modal_inputs
from verl.utils.import_utils import load_module
from verl.workers.config.data import as_data_config

logger = logging.getLogger(__name__)

TRUNCATION_MODES = TRUNCATIONS
# processors whose models take Qwen2-VL's 3-D rotary positions (computed here for image prompts)
MROPE_PROCESSORS = ("Qwen2VLProcessor", "Qwen2_5_VLProcessor")
OVERLONG_FIX = (
    "set data.truncation=left|right|middle, or data.filter_overlong_prompts=True, or raise data.max_prompt_length"
)



def _as_file_list(data_files) -> list[str]:
    if isinstance(data_files, (str, os.PathLike)):
        data_files = [data_files]
    files = [os.path.expanduser(str(f)) for f in data_files]
    if not files:
        raise ValueError("no data files given; set data.train_files / data.val_files to one or more parquet files")
    return files


def read_parquet_rows(path: str) -> list[dict]:
    """All rows of one parquet file as Python dicts, with errors that name the file."""
    if not os.path.exists(path):
        raise FileNotFoundError(
            f"data file {path} does not exist; check data.train_files / data.val_files "
            "(examples/data_preprocess/*.py write train.parquet and test.parquet)"
        )
    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as err:
        raise ValueError(f"data file {path} is not a readable parquet file: {err}") from err
    if table.num_rows == 0:
        raise ValueError(f"data file {path} has no rows; regenerate it or remove it from the data files")
    return table.to_pylist()


def kept_rows(n_rows: int, max_samples: int, shuffle: bool, seed: int) -> np.ndarray | None:
    """The row numbers (of all files, in order) that ``data.train_max_samples`` / ``val_max_samples`` keep, or
    None when every row is kept: a random choice (``data.shuffle``, seeded by ``data.seed``) or the first rows."""
    if not 0 < max_samples < n_rows:
        return None
    if shuffle:
        return np.sort(np.random.default_rng(seed).choice(n_rows, max_samples, replace=False))
    return np.arange(max_samples)


def truncate_ids(ids: list[int], max_length: int, truncation: str) -> list[int]:
    """Cut ``ids`` to ``max_length`` tokens: left keeps the tail, right the head, middle both ends."""
    if len(ids) <= max_length:
        return ids
    if truncation == "left":
        return ids[-max_length:]
    if truncation == "right":
        return ids[:max_length]
    if truncation == "middle":
        head = max_length // 2
        tail = max_length - head
        return ids[:head] + (ids[-tail:] if tail else [])
    raise ValueError(f"unknown truncation {truncation!r}; choose one of {TRUNCATION_MODES}")


def left_pad(ids: list[int], max_length: int, pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(input_ids, attention_mask, position_ids)`` of length ``max_length``, padding on the left."""
    n_pad = max_length - len(ids)
    input_ids = torch.tensor([pad_token_id] * n_pad + list(ids), dtype=torch.long)
    attention_mask = torch.cat([torch.zeros(n_pad, dtype=torch.long), torch.ones(len(ids), dtype=torch.long)])
    position_ids = torch.clamp(torch.cumsum(attention_mask, dim=0) - 1, min=0)
    return input_ids, attention_mask, position_ids


class RLHFDataset(Dataset):
    """Prompts from one or many parquet files, tokenized with the chat template (see the module docstring).

    ``config`` is the ``data`` section: a DictConfig, a mapping with any subset of its keys (the others take the
    schema's defaults) or a :class:`~verl.workers.config.data.DataConfig`; a bad value raises ``ConfigError``
    naming the key. Read here: prompt_key, max_prompt_length, truncation, filter_overlong_prompts(_workers),
    tool_config_path, return_raw_chat, return_full_prompt, chat_template, apply_chat_template_kwargs, image_key,
    video_key, return_multi_modal_inputs, shuffle and seed (only to choose which rows ``max_samples`` keeps).
    ``self.config`` is ``config`` as given (a subclass may read keys of its own from it), ``self.data_config``
    the typed section.
    """

    def __init__(self, data_files, tokenizer, config, processor=None, max_samples: int = -1):
        self.data_files = _as_file_list(data_files)
        self.tokenizer = tokenizer
        self.processor = processor
        self.config = config
        self.data_config = data = as_data_config(config)
        self.max_samples = int(max_samples if max_samples is not None else -1)

        self.prompt_key = data.prompt_key
        self.max_prompt_length = data.max_prompt_length
        self.truncation = data.truncation
        self.filter_overlong_prompts = data.filter_overlong_prompts
        self.filter_overlong_prompts_workers = data.filter_overlong_prompts_workers
        self.tool_config_path = data.tool_config_path
        self.return_raw_chat = data.return_raw_chat
        self.return_full_prompt = data.return_full_prompt
        self.chat_template = data.chat_template
        self.apply_chat_template_kwargs = dict(data.apply_chat_template_kwargs)
        self.shuffle = data.shuffle
        self.seed = 1 if data.seed is None else data.seed  # the schema's data.seed: null means 1
        self.image_key = data.image_key
        self.video_key = data.video_key
        self.return_multi_modal_inputs = data.return_multi_modal_inputs

        if self.chat_template is None and not getattr(tokenizer, "chat_template", None):
            raise ValueError(
                "the tokenizer has no chat template; use a chat model's tokenizer or set data.chat_template"
            )
        if tokenizer.pad_token_id is None:
            raise ValueError("the tokenizer has no pad token; set tokenizer.pad_token (e.g. to its eos token)")

        self._read_files_and_tokenize()
        self.check_multi_modal_rows()

    # ---- reading -------------------------------------------------------------------------------------------
    def _read_files_and_tokenize(self) -> None:
        rows, origins = [], []
        for path in self.data_files:
            file_rows = read_parquet_rows(path)
            if self.prompt_key not in file_rows[0]:
                raise KeyError(
                    f"data file {path} has no column {self.prompt_key!r} (data.prompt_key); its columns are "
                    f"{sorted(file_rows[0])}; set data.prompt_key to the column holding the chat prompt"
                )
            rows.extend(file_rows)
            origins.extend((path, i) for i in range(len(file_rows)))
        keep = kept_rows(len(rows), self.max_samples, self.shuffle, self.seed)
        if keep is not None:
            rows = [rows[i] for i in keep]
            origins = [origins[i] for i in keep]
        self.dataframe: list[dict] = rows
        self._origins: list[tuple[str, int]] = origins
        self.maybe_filter_out_long_prompts()

    def maybe_filter_out_long_prompts(self) -> None:
        """Drop rows whose rendered prompt exceeds max_prompt_length (only with filter_overlong_prompts)."""
        if not self.filter_overlong_prompts:
            return
        tools = self._tool_schemas()
        workers = min(self.filter_overlong_prompts_workers, len(self.dataframe))
        if workers > 1 and "fork" in multiprocessing.get_all_start_methods():
            bounds = np.linspace(0, len(self.dataframe), workers + 1).astype(int)
            spans = [(int(a), int(b), tools) for a, b in zip(bounds[:-1], bounds[1:])]
            _FORKED["dataset"] = self  # the forked children read it from here: nothing is pickled
            try:
                with multiprocessing.get_context("fork").Pool(workers) as pool:
                    lengths = [n for part in pool.map(_forked_prompt_lengths, spans) for n in part]
            finally:
                _FORKED.clear()
        else:
            lengths = self._prompt_lengths(0, len(self.dataframe), tools)
        keep = [i for i, n in enumerate(lengths) if n <= self.max_prompt_length]
        dropped = len(self.dataframe) - len(keep)
        if not keep:
            raise ValueError(
                f"every prompt in {self.data_files} is longer than data.max_prompt_length={self.max_prompt_length} "
                f"tokens (shortest: {min(lengths)}); raise data.max_prompt_length"
            )
        if dropped:
            logger.warning(
                "filtered %d of %d prompts longer than %d tokens", dropped, len(lengths), self.max_prompt_length
            )
        self.dataframe = [self.dataframe[i] for i in keep]
        self._origins = [self._origins[i] for i in keep]

    def _tool_schemas(self) -> list[dict] | None:
        """The schemas the tool agent renders prompts with (``data.tool_config_path``), or None."""
        if not self.tool_config_path:
            return None
        return tool_schemas(initialize_tools_from_config(self.tool_config_path, "data.tool_config_path")) or None

    def _prompt_lengths(self, start: int, stop: int, tools: list[dict] | None) -> list[int]:
        """Rendered prompt lengths (tokens) of rows ``start:stop``."""
        rows = range(start, stop)
        if self.processor is not None:  # image tokens count: the processor expands each image
            return [len(self._encode(copy.deepcopy(self.dataframe[i]), i)[1]) for i in rows]
        texts = [self._render(self._messages_of(dict(self.dataframe[i]), i), tools) for i in rows]
        return [len(ids) for ids in self.tokenizer(texts, add_special_tokens=False)["input_ids"]] if texts else []

    # ---- one item ------------------------------------------------------------------------------------------
    def _where(self, item: int) -> str:
        path, row = self._origins[item]
        return f"row {row} of {path}"

    def _messages_of(self, example: dict, item: int) -> list[dict]:
        try:
            return self._build_messages(example)
        except ValueError as err:
            raise ValueError(f"{self._where(item)}: {err}") from err

    def _build_messages(self, example: dict) -> list[dict]:
        """Pop the prompt column and return it as a chat list (a bare string becomes one user turn).
        Override this in a subclass to change the prompt (verl's hook, same signature)."""
        prompt = example.pop(self.prompt_key)
        if isinstance(prompt, str):
            return [{"role": "user", "content": prompt}]
        if isinstance(prompt, np.ndarray):
            prompt = prompt.tolist()
        if not isinstance(prompt, list) or not all(
            isinstance(m, dict) and "role" in m and "content" in m for m in prompt
        ):
            raise ValueError(
                f"{self.prompt_key!r} must be a chat list like [{{'role': 'user', 'content': '...'}}], "
                f"got {type(prompt).__name__}"
            )
        return prompt

    def _render(self, messages: list[dict], tools: list[dict] | None = None) -> str:
        kwargs = dict(self.apply_chat_template_kwargs)
        if tools:
            kwargs["tools"] = tools
        if self.chat_template is not None:
            kwargs["chat_template"] = self.chat_template
        renderer = self.processor if self.processor is not None else self.tokenizer
        return renderer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, **kwargs)

    def __len__(self) -> int:
        return len(self.dataframe)

    # ---- images ----------------------------------------------------------------------------------------------
    def _row_images(self, row: dict, item: int) -> list:
        """Pop and decode the row's ``data.image_key`` column ([] when absent or empty)."""
        if row.get(self.video_key) is not None and len(row[self.video_key]) > 0:
            raise NotImplementedError(
                f"{self._where(item)} has videos in column {self.video_key!r} (data.video_key); only images are "
                "supported: drop the column"
            )
        images = row.pop(self.image_key, None)
        if images is None:
            return []
        if isinstance(images, dict) or not hasattr(images, "__len__"):
            images = [images]
        if len(images) and self.processor is None:
            raise ValueError(
                f"{self._where(item)} holds {len(images)} image(s) in column {self.image_key!r} (data.image_key) "
                "but the model has no image processor; use a vision-language model (e.g. Qwen2-VL) whose directory "
                "has preprocessor_config.json, or point data.image_key at a column that does not exist"
            )
        decoded = []
        for k, image in enumerate(images):
            try:
                decoded.append(decode_image(image))
            except ValueError as err:
                raise ValueError(f"{self._where(item)}: image {k} of column {self.image_key!r} "
                                 f"(data.image_key) cannot be decoded: {err}") from err
        return decoded

    def _to_multi_modal_messages(self, messages: list[dict]) -> list[dict]:
        """verl's convention: string contents are split at ``<image>`` / ``<video>`` into typed content items."""
        out = []
        for message in messages:
            content = message["content"]
            if isinstance(content, str):
                parts = [p for p in re.split(r"(<image>|<video>)", content) if p]
                content = [{"type": p[1:-1]} if p in ("<image>", "<video>") else {"type": "text", "text": p}
                           for p in parts]
            out.append({**message, "content": content})
        return out

    def _check_image_slots(self, messages: list[dict], images: list, item: int) -> None:
        slots = sum(1 for m in messages if not isinstance(m["content"], str)
                    for c in m["content"] if isinstance(c, dict) and c.get("type") == "image")
        if slots != len(images):
            raise ValueError(
                f"{self._where(item)}: the prompt has {slots} <image> placeholder(s) but column {self.image_key!r} "
                f"(data.image_key) holds {len(images)} image(s); put exactly one <image> in the prompt text per "
                "image, in the order of the images"
            )

    def check_multi_modal_rows(self) -> None:
        """Decode every row's images and match them to the placeholders up front, so a bad row stops the run
        before training starts (errors name the file, row and key)."""
        if not any(self.image_key in row or self.video_key in row for row in self.dataframe[:1]):
            return
        if self.processor is not None:
            self._check_processor()
        for i, row in enumerate(self.dataframe):
            row = dict(row)
            images = self._row_images(row, i)
            if self.processor is not None:
                self._check_image_slots(self._to_multi_modal_messages(self._messages_of(row, i)), images, i)

    def _check_processor(self) -> None:
        name = type(self.processor).__name__
        if name not in MROPE_PROCESSORS:
            raise NotImplementedError(f"image prompts are supported for {', '.join(MROPE_PROCESSORS)}, "
                                      f"not the model's {name}")

    def _encode(self, row: dict, item: int) -> tuple[list[dict], list[int], str, dict]:
        """Pop the prompt (and images) from ``row``; returns (messages, ids, rendered prompt, processor extras)."""
        if self.processor is None:
            self._row_images(row, item)  # a row with images needs a processor: say so
            messages = self._messages_of(row, item)
            raw_prompt = self._render(messages)
            return messages, self.tokenizer.encode(raw_prompt, add_special_tokens=False), raw_prompt, {}
        self._check_processor()
        images = self._row_images(row, item)
        messages = self._to_multi_modal_messages(self._messages_of(row, item))
        self._check_image_slots(messages, images, item)
        raw_prompt = self._render(messages)
        inputs = self.processor(text=[raw_prompt], images=images or None, return_tensors="pt")
        extras = {"images": images}
        if images:
            extras["multi_modal_inputs"] = {"pixel_values": inputs["pixel_values"],
                                            "image_grid_thw": inputs["image_grid_thw"]}
        return messages, inputs["input_ids"][0].tolist(), raw_prompt, extras

    def __getitem__(self, item: int) -> dict[str, Any]:
        row = copy.deepcopy(self.dataframe[item])
        messages, ids, raw_prompt, extras = self._encode(row, item)
        if len(ids) > self.max_prompt_length:
            if self.truncation == "error" or extras.get("images"):
                raise ValueError(
                    f"prompt in {self._where(item)} is {len(ids)} tokens, longer than "
                    f"data.max_prompt_length={self.max_prompt_length}; "
                    + ("prompts with images are never cut (that would cut image tokens): raise "
                       "data.max_prompt_length or set data.filter_overlong_prompts=True"
                       if extras.get("images") else OVERLONG_FIX)
                )
            ids = truncate_ids(ids, self.max_prompt_length, self.truncation)
        row["input_ids"], row["attention_mask"], row["position_ids"] = left_pad(
            ids, self.max_prompt_length, self.tokenizer.pad_token_id
        )
        row["raw_prompt_ids"] = ids
        if self.processor is not None:
            mm_inputs = extras.get("multi_modal_inputs", {})
            row["position_ids"] = mrope_position_ids(
                row["input_ids"], row["attention_mask"], mm_inputs.get("image_grid_thw"),
                self.processor.image_token_id, self.processor.image_processor.merge_size)
            # vLLM takes the prompt with one placeholder per image and expands it itself
            row["raw_prompt_ids"] = self.tokenizer.encode(raw_prompt, add_special_tokens=False)
            row["multi_modal_data"] = {"image": extras["images"]}
            if self.return_multi_modal_inputs:
                row["multi_modal_inputs"] = mm_inputs
        if self.return_raw_chat:
            row["raw_prompt"] = messages
        if self.return_full_prompt:
            row["full_prompts"] = raw_prompt
        extra_info = row.get("extra_info")
        index = extra_info.get("index") if isinstance(extra_info, dict) else None
        row["index"] = item if index is None else index
        # per-episode tool / interaction arguments for the agent loop (verl's fields; empty when absent)
        extra = extra_info if isinstance(extra_info, dict) else {}
        row["tools_kwargs"] = extra.get("tools_kwargs") or {}
        row["interaction_kwargs"] = extra.get("interaction_kwargs") or {}
        return row


_FORKED: dict[str, Any] = {}


def _forked_prompt_lengths(span: tuple) -> list[int]:
    start, stop, tools = span
    return _FORKED["dataset"]._prompt_lengths(start, stop, tools)


def collate_fn(data_list: list[dict]) -> dict[str, Any]:
    """Stack tensors; gather everything else into 1-D object arrays (one entry per sample)."""
    tensors, non_tensors = defaultdict(list), defaultdict(list)
    for data in data_list:
        for key, value in data.items():
            (tensors if isinstance(value, torch.Tensor) else non_tensors)[key].append(value)
    out: dict[str, Any] = {key: torch.stack(values, dim=0) for key, values in tensors.items()}
    for key, values in non_tensors.items():
        arr = np.empty(len(values), dtype=object)  # element by element: numpy would turn equal-length lists 2-D
        for i, value in enumerate(values):
            arr[i] = value
        out[key] = arr
    if "multi_modal_inputs" in non_tensors:  # the images' tensors, padded so they travel with the batch rows
        out.update(pad_multi_modal_inputs(list(non_tensors["multi_modal_inputs"])))
    return out


# ---- construction helpers used by the trainer -------------------------------------------------------------
def get_dataset_class(data_config):
    """``RLHFDataset``, or the class named by ``data.custom_cls.{path,name}`` (loaded from the user's file)."""
    custom = as_data_config(data_config).custom_cls
    path, name = custom.path, custom.name
    if path is None:
        return RLHFDataset
    if not name:
        raise ValueError(f"data.custom_cls.path={path} is set but data.custom_cls.name is empty; name the class")
    if not path.startswith("pkg://") and not os.path.isfile(os.path.expanduser(path)):
        raise FileNotFoundError(f"data.custom_cls.path={path}: no such file; point it at the .py file defining {name}")
    module = load_module(path)
    cls = getattr(module, name, None)
    if cls is None:
        raise AttributeError(f"data.custom_cls.name={name!r} is not defined in {path} (data.custom_cls.path)")
    if not (isinstance(cls, type) and issubclass(cls, Dataset)):
        raise TypeError(f"data.custom_cls {name} in {path} must be a subclass of torch.utils.data.Dataset")
    return cls


def create_rl_dataset(data_paths, data_config, tokenizer, processor=None, is_train: bool = True, max_samples=None):
    """Build the train (or validation) dataset; ``max_samples`` defaults to data.train/val_max_samples. The class
    gets ``data_config`` as given (a custom class may read keys of its own from it)."""
    data = as_data_config(data_config)
    cls = get_dataset_class(data)
    if max_samples is None:
        max_samples = data.train_max_samples if is_train else data.val_max_samples
    kwargs = dict(data_files=data_paths, tokenizer=tokenizer, processor=processor, config=data_config)
    params = inspect.signature(cls.__init__).parameters
    if "max_samples" in params or any(p.kind is p.VAR_KEYWORD for p in params.values()):
        kwargs["max_samples"] = max_samples
    elif max_samples is not None and max_samples > 0:
        raise ValueError(
            f"{cls.__name__} (data.custom_cls) takes no max_samples argument; unset data.train_max_samples / "
            "data.val_max_samples or accept max_samples in its __init__"
        )
    return cls(**kwargs)


def create_rl_sampler(data_config, dataset):
    """The sampler for the training dataloader.

    ``data.sampler.class_path``/``class_name`` loads a user sampler built as ``cls(data_source=, data_config=)``;
    else ``data.shuffle`` gives a random order seeded by ``data.seed`` (null: 1), otherwise the file order. The
    random sampler can resume mid-epoch: with torchdata installed it is torchdata's ``RandomSampler`` (use
    ``StatefulDataLoader``, see ``verl.utils.dataset.dataloader``), else ``ResumableRandomSampler``.
    """
    data = as_data_config(data_config)
    class_path, class_name = data.sampler.class_path, data.sampler.class_name
    if class_path is not None:
        cls = getattr(load_module(class_path), class_name or "", None)
        if cls is None:
            raise AttributeError(f"data.sampler.class_name={class_name!r} is not defined in {class_path}")
        return cls(data_source=dataset, data_config=data_config)
    if data.shuffle:
        return make_random_sampler(dataset, seed=1 if data.seed is None else data.seed)
    return make_sequential_sampler(dataset)
