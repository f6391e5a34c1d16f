"""What is inside the run's files and directories, checked before Ray starts.

``validate_ppo_config`` calls :func:`check_run_files` in its file phase (so the driver and ``main_ppo
--check-config`` run it) once the files are known to exist. Each check stands for a problem that otherwise shows
only after the workers have started, sometimes many steps in, and each raises one ``ConfigError`` naming the
key, the file (and row) and what would work. Nothing is imported from the user's files and nothing is written.

- Data (``data.train_files`` / ``data.val_files``, read by the built-in dataset, i.e. no ``data.custom_cls``):
  every file is a readable parquet file with rows and the ``data.prompt_key`` column; the training rows (after
  ``data.train_max_samples``) fill at least one ``data.train_batch_size``.
- Reward fields, when the rule-based reward scores the rows (a built-in reward manager, no reward model, the
  single-turn agent loop): the ``data.reward_fn_key`` column; and with the built-in scorer (no
  ``custom_reward_function.path``) every row's ``reward_model.ground_truth`` and a ``data_source`` it knows.
  Only those columns are read (pyarrow), and only the rows that ``data.*_max_samples`` keeps.
- Tokenizer: ``actor_rollout_ref.model.tokenizer_path`` (else ``.model.path``), when a local directory, holds
  tokenizer files; without them the tokenizer loads empty and every prompt becomes zero tokens.
- User code: ``custom_reward_function.name``, ``data.custom_cls.name`` and ``reward_manager.module.name`` are
  defined in their files (read with ``ast``, not imported).
- Directories: ``trainer.default_local_dir``, ``trainer.rollout_data_dir`` and ``trainer.validation_data_dir``
  are directories or can be created, and are writable; with ``trainer.resume_mode=resume_path``,
  ``trainer.resume_from_path`` is a checkpoint directory holding the actor's state (and the critic's when a
  critic trains).

The checks read the config's typed view (the schema's frozen classes, so a key the yaml leaves out has the
schema's default), built once per call of :func:`check_run_files` or passed in by the validator, which has it.
"""

from __future__ import annotations

import ast
import os
from operator import attrgetter
from typing import Any, Optional

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from omegaconf import DictConfig, ListConfig

from verl.trainer.config_schema.ppo import PPOTrainerConfig, as_ppo_config
from verl.utils.config import ConfigError
from verl.utils.dataset.rl_dataset import kept_rows
from verl.utils.reward_score import get_score_fn, supported_data_sources

__all__ = ["check_run_files", "check_data", "check_tokenizer", "check_user_code", "check_output_dirs",
           "TOKENIZER_FILES"]

AR = "actor_rollout_ref"
# reward managers that read data.reward_fn_key and reward_model.ground_truth from every row
BUILTIN_REWARD_MANAGERS = ("naive", "batch", "prime", "dapo")
# any one of these makes a directory's tokenizer loadable (fast tokenizer, sentencepiece, BPE or WordPiece vocab)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model",
                   "sentencepiece.bpe.model")
TOKENIZER_SUFFIXES = (".tiktoken", ".model", ".spm")


def _paths(value: Any) -> list[str]:
    if value is None:
        return []
    values = list(value) if isinstance(value, (list, tuple, ListConfig)) else [value]
    return [os.path.expanduser(str(v)) for v in values]


def check_run_files(config: DictConfig, use_critic: bool, typed: Optional[PPOTrainerConfig] = None) -> None:
    """Every check of this module, in the order a run would meet the problems. ``typed``: the config's typed view,
    when the caller has built it (each check below takes it the same way)."""
    typed = as_ppo_config(config, typed)
    check_tokenizer(config, typed=typed)
    check_user_code(config, typed=typed)
    check_data(config, typed=typed)
    check_output_dirs(config, use_critic, typed=typed)


# ------------------------------------------------------------------------------------------------- data

class _DataFile:
    """One parquet file (or directory of parquet files): its columns and row count, read from the metadata."""

    def __init__(self, key: str, path: str):
        self.key, self.path = key, path
        try:
            self.columns = list(pq.ParquetDataset(path).schema.names)
            self.num_rows = pq.read_table(path, columns=[]).num_rows
        except (pa.ArrowException, OSError) as err:
            reason = (str(err).strip().splitlines() or [type(err).__name__])[0].rstrip(".")
            raise ConfigError(f"{key}: {path} is not a readable parquet file ({reason}). Write it again (pyarrow or "
                              f"pandas .to_parquet) or remove it from {key}") from None
        if self.num_rows == 0:
            raise ConfigError(f"{key}: {path} has no rows. Write it again or remove it from {key}")

    def column(self, name: str) -> pa.ChunkedArray:
        return pq.read_table(self.path, columns=[name]).column(name)

    def where(self, row: int) -> str:
        return f"{self.key}: row {row} of {self.path}"


def _kept(data, files: list[_DataFile], max_samples: int) -> list[Optional[np.ndarray]]:
    """Per file, the row numbers the dataset keeps under ``data.*_max_samples`` (None: every row); ``data``: the
    typed ``data`` section."""
    seed = 1 if data.seed is None else data.seed  # as the dataset reads data.seed: null means 1
    keep = kept_rows(sum(f.num_rows for f in files), max_samples, data.shuffle, seed)
    if keep is None:
        return [None] * len(files)
    out, start = [], 0
    for f in files:
        out.append(keep[(keep >= start) & (keep < start + f.num_rows)] - start)
        start += f.num_rows
    return out


def _first(bad: np.ndarray, keep: Optional[np.ndarray]) -> Optional[int]:
    """The first row flagged in ``bad`` (a bool per row) among the kept rows, or None."""
    rows = np.flatnonzero(bad)
    if keep is not None:
        rows = rows[np.isin(rows, keep)]
    return int(rows[0]) if len(rows) else None


def _reward_reads_rows(typed: PPOTrainerConfig, f: _DataFile) -> bool:
    """True when the rule-based reward manager scores this file's rows from their own fields."""
    if typed.reward_model.enable:
        return False  # the reward model's scores pass through the manager
    if typed.reward_manager.source != "register":
        return False  # the user's own manager reads what it reads
    names = {typed.reward_manager.name, typed.reward_model.reward_manager} - {None}
    if not names <= set(BUILTIN_REWARD_MANAGERS):
        return False
    rollout = typed.actor_rollout_ref.rollout
    agentic = (rollout.multi_turn.enable or rollout.multi_turn.interaction_config_path
               or rollout.agent.agent_loop_config_path or rollout.agent.default_agent_loop != "single_turn_agent")
    return not agentic and "agent_name" not in f.columns  # an agent loop may return its own reward


def _missing_ground_truth(col: pa.ChunkedArray) -> np.ndarray:
    """A bool per row: the row has no ``reward_model.ground_truth`` (or it is null)."""
    if pa.types.is_struct(col.type):
        if col.type.get_field_index("ground_truth") < 0:
            return np.ones(len(col), dtype=bool)
        missing = pc.or_(pc.is_null(col), pc.is_null(pc.struct_field(col, "ground_truth")))
        return missing.to_numpy(zero_copy_only=False)
    # another layout (a map, JSON text): judged as the dataset hands the cells to the reward manager
    return np.array([not (isinstance(v, dict) and v.get("ground_truth") is not None) for v in col.to_pylist()])


def _check_reward_fields(typed: PPOTrainerConfig, f: _DataFile, keep: Optional[np.ndarray]) -> None:
    fn_key = str(typed.data.reward_fn_key)
    builtin_scorer = not typed.custom_reward_function.path
    if fn_key not in f.columns:
        raise ConfigError(
            f"{f.key}: {f.path} has no column {fn_key!r} (data.reward_fn_key), which the reward manager reads from "
            f"every row to pick the scorer; its columns are {sorted(f.columns)}. Add the column, or set "
            "data.reward_fn_key to the column that names each row's data source")
    if not builtin_scorer:
        return  # the user's function gets ground_truth=None for rows without one, and any data source
    if "reward_model" not in f.columns:
        raise ConfigError(
            f"{f.where(0)} has no reward_model.ground_truth (the file has no 'reward_model' column): the built-in "
            "reward compares each response with it. Add reward_model={'ground_truth': ...} to every row, or score "
            "with your own function: custom_reward_function.path=<file.py> (ground_truth is None for such rows)")
    row = _first(_missing_ground_truth(f.column("reward_model")), keep)
    if row is not None:
        raise ConfigError(
            f"{f.where(row)} has no reward_model.ground_truth: the built-in reward compares each response with it. "
            "Add reward_model.ground_truth to every row, or score with your own function: "
            "custom_reward_function.path=<file.py> (ground_truth is None for such rows)")
    if typed.actor_rollout_ref.model.external_lib:
        return  # the library may register scorers for more data sources
    sources = f.column(fn_key).to_pylist()
    unknown = {s for s in set(map(str, sources)) if get_score_fn(s) is None}
    row = _first(np.fromiter((str(s) in unknown for s in sources), dtype=bool, count=len(sources)), keep)
    if row is not None:
        raise ConfigError(
            f"{f.where(row)} has {fn_key}={str(sources[row])!r} (data.reward_fn_key), which no built-in reward "
            f"function scores (they score: {', '.join(supported_data_sources())}). Score it with your own "
            "function: custom_reward_function.path=<file.py> with def compute_score(data_source, solution_str, "
            "ground_truth, extra_info=None), or register one with verl.utils.reward_score.register_score_fn")


def check_data(config: DictConfig, typed: Optional[PPOTrainerConfig] = None) -> None:
    """Readable files with rows, the prompt column, enough training rows, and the reward fields (module doc)."""
    typed = as_ppo_config(config, typed)
    data = typed.data
    if data.custom_cls.path:
        return  # the user's dataset class reads the files its own way
    prompt_key = str(data.prompt_key)
    for key, files_value, max_samples in (("data.train_files", data.train_files, data.train_max_samples),
                                          ("data.val_files", data.val_files, data.val_max_samples)):
        files = [_DataFile(key, p) for p in _paths(files_value)]
        for f in files:
            if prompt_key not in f.columns:
                raise ConfigError(
                    f"{key}: {f.path} has no column {prompt_key!r} (data.prompt_key); its columns are "
                    f"{sorted(f.columns)}. Set data.prompt_key to the column holding the chat prompt")
        kept = _kept(data, files, max_samples)
        if key == "data.train_files":
            rows = sum(f.num_rows if k is None else len(k) for f, k in zip(files, kept))
            batch = int(data.train_batch_size)
            if rows < batch:
                where = ", ".join(f.path for f in files)
                kept_by = f" (data.train_max_samples={max_samples})" if 0 < max_samples else ""
                raise ConfigError(
                    f"data.train_files: {rows} training rows{kept_by} in {where}, fewer than "
                    f"data.train_batch_size={batch}: not one full batch. Lower data.train_batch_size to at most "
                    f"{rows} or add rows")
        for f, keep in zip(files, kept):
            if _reward_reads_rows(typed, f):
                _check_reward_fields(typed, f, keep)


# -------------------------------------------------------------------------------------------- tokenizer

def check_tokenizer(config: DictConfig, typed: Optional[PPOTrainerConfig] = None) -> None:
    """The actor's tokenizer directory holds tokenizer files (a hub id or cached model is not checked)."""
    model = as_ppo_config(config, typed).actor_rollout_ref.model
    key, value = ((f"{AR}.model.tokenizer_path", model.tokenizer_path) if model.tokenizer_path
                  else (f"{AR}.model.path", model.path))
    path = os.path.expanduser(str(value))
    if value is None or not os.path.isdir(path):
        return
    names = os.listdir(path)
    if any(n in TOKENIZER_FILES or n.endswith(TOKENIZER_SUFFIXES) for n in names):
        return
    if "tokenizer_config.json" in names and '"auto_map"' in _read_text(os.path.join(path, "tokenizer_config.json")):
        return  # a tokenizer class of the model's own code, which knows its files
    fix = (f"set {AR}.model.tokenizer_path to a directory that has them" if key.endswith("model.path")
           else f"point {key} at the directory of the model's tokenizer")
    raise ConfigError(
        f"{key}={value} has no tokenizer: none of {', '.join(TOKENIZER_FILES)} is there, so the tokenizer would load "
        f"empty and every prompt would be zero tokens. Copy the tokenizer files of the model into it, or {fix}")


def _read_text(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    except (OSError, UnicodeDecodeError):
        return ""


# -------------------------------------------------------------------------------------------- user code

def _defined_names(path: str, key: str) -> tuple[Optional[set], list[str]]:
    """(names bound at the top of the file, its top-level functions and classes). The set is None when the file
    binds names in ways a reading cannot follow (``import *``, ``globals()``, a module ``__getattr__``)."""
    source = _read_text(path)
    try:
        tree = ast.parse(source, filename=path)
    except SyntaxError as err:
        raise ConfigError(f"{key}={path} cannot be loaded: {err.msg} at line {err.lineno}. Fix the file") from None
    listed = [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
    if "globals()" in source or "exec(" in source or "__getattr__" in listed:
        return None, listed
    names: set = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Global):
            names.update(node.names)
    stack = list(tree.body)
    while stack:  # every statement at module level, not the bodies of functions and classes
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                if alias.name == "*":
                    return None, listed
                names.add(alias.asname or alias.name.split(".")[0])
            continue
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        if not isinstance(node, ast.Lambda):
            stack.extend(ast.iter_child_nodes(node))
    return names, listed


def _check_defined(path_key: str, name_key: str, path: Any, name: Any, what: str) -> None:
    if not path or str(path).startswith("pkg://"):
        return
    full = os.path.expanduser(str(path))
    if not os.path.isfile(full):
        return  # the existence check names it
    if not name:
        raise ConfigError(f"{path_key}={path} is set but {name_key} is empty: name the {what} to use")
    names, listed = _defined_names(full, path_key)
    if names is None or str(name) in names:
        return
    hint = f"set {name_key}={listed[0]}" if len(listed) == 1 else f"set {name_key} to one of them"
    raise ConfigError(f"{name_key}={name} is not defined in {full} ({path_key}); defined there: "
                      f"{', '.join(listed) or 'no functions or classes'}. Define {name} there or {hint}")


def check_user_code(config: DictConfig, typed: Optional[PPOTrainerConfig] = None) -> None:
    """The functions and classes named by the config exist in the user's files."""
    typed = as_ppo_config(config, typed)
    scorer, dataset, manager = typed.custom_reward_function, typed.data.custom_cls, typed.reward_manager
    _check_defined("custom_reward_function.path", "custom_reward_function.name", scorer.path, scorer.name,
                   "scoring function")
    _check_defined("data.custom_cls.path", "data.custom_cls.name", dataset.path, dataset.name, "dataset class")
    if manager.source == "importlib":
        _check_defined("reward_manager.module.path", "reward_manager.module.name", manager.module.path,
                       manager.module.name, "reward manager class")


# ------------------------------------------------------------------------------------------- directories

OUTPUT_DIRS = {
    "trainer.default_local_dir": "checkpoints and training_curves.png are written there",
    "trainer.rollout_data_dir": "each step's rollouts are written there as <step>.jsonl",
    "trainer.validation_data_dir": "each validation's generations are written there as <step>.jsonl",
}


def _check_output_dir(key: str, value: Any, what: str) -> None:
    if not value or "://" in str(value):
        return
    path = os.path.abspath(os.path.expanduser(str(value)))
    if os.path.exists(path) and not os.path.isdir(path):
        raise ConfigError(f"{key}={value} is a file, not a directory ({what}). Point {key} at a directory "
                          "(a missing one is created)")
    probe = path
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe):
        raise ConfigError(f"{key}={value} cannot be created: {probe} is a file ({what}). Point {key} at a "
                          "directory")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise ConfigError(f"{key}={value}: {probe} is not writable by this user ({what}). Point {key} at a "
                          "writable directory")


def _check_resume_path(value: Any, use_critic: bool) -> None:
    path = os.path.abspath(os.path.expanduser(str(value)))
    if os.path.isfile(path):
        raise ConfigError(f"trainer.resume_from_path={value} is a file, not a checkpoint directory. Point it at "
                          "<trainer.default_local_dir>/global_step_N")
    if not os.path.isdir(path):
        raise ConfigError(f"trainer.resume_from_path: directory not found: {value}")
    roles = ["actor"] + (["critic"] if use_critic else [])
    missing = [r for r in roles if not os.path.isdir(os.path.join(path, r))]
    if missing:
        raise ConfigError(
            f"trainer.resume_from_path={value} holds no {missing[0]}/ checkpoint (a complete global_step_N "
            f"directory has {' and '.join(r + '/' for r in roles)}). Point it at a checkpoint this trainer wrote, or "
            "use trainer.resume_mode=auto to resume from the latest one under trainer.default_local_dir")


def check_output_dirs(config: DictConfig, use_critic: bool, typed: Optional[PPOTrainerConfig] = None) -> None:
    """The directories the run writes can be written; a resume path holds the roles' checkpoints."""
    typed = as_ppo_config(config, typed)
    for key, what in OUTPUT_DIRS.items():
        _check_output_dir(key, attrgetter(key)(typed), what)
    if typed.trainer.resume_mode == "resume_path":
        _check_resume_path(typed.trainer.resume_from_path, use_critic)
