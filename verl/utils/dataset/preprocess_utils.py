"""Helpers shared by ``examples/data_preprocess/*.py``: read a local dataset file, extract answers, write parquet.

Only the standard library and pyarrow are imported here, so the scripts start in well under a second.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re

import pyarrow as pa
import pyarrow.parquet as pq

GSM8K_INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
MATH_INSTRUCTION = "Let's think step by step and output the final answer within \\boxed{}."

_SUFFIXES = (".jsonl", ".json", ".parquet")


def read_records(path: str) -> list[dict]:
    """Rows of a .jsonl, .json (a list of objects) or .parquet file."""
    path = os.path.expanduser(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"input file {path} does not exist")
    if path.endswith(".parquet"):
        return pq.read_table(path).to_pylist()
    with open(path, encoding="utf-8") as f:
        if path.endswith(".jsonl"):
            rows = []
            for n, line in enumerate(f, 1):
                if line.strip():
                    try:
                        rows.append(json.loads(line))
                    except json.JSONDecodeError as err:
                        raise ValueError(f"{path}, line {n}: not valid JSON ({err})") from err
            return rows
        if path.endswith(".json"):
            data = json.load(f)
            if not isinstance(data, list):
                raise ValueError(f"{path} must hold a JSON list of objects")
            return data
    raise ValueError(f"input file {path}: unsupported format; use one of {', '.join(_SUFFIXES)}")


def find_split_files(directory: str) -> dict[str, str]:
    """``{"train": path, "test": path}`` for files under ``directory`` whose names contain train / test
    (e.g. HF's ``main/train-00000-of-00001.parquet`` or ``train.jsonl``)."""
    directory = os.path.expanduser(directory)
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"dataset directory {directory} does not exist")
    found = {}
    for split in ("train", "test"):
        matches = sorted(
            p for p in glob.glob(os.path.join(directory, "**", f"*{split}*"), recursive=True) if p.endswith(_SUFFIXES)
        )
        if matches:
            found[split] = matches[0]
    if not found:
        raise FileNotFoundError(f"no *train* or *test* .jsonl/.json/.parquet file under {directory}")
    return found


def require_fields(rows: list[dict], fields: tuple[str, ...], path: str) -> None:
    if not rows:
        raise ValueError(f"{path} has no rows")
    missing = [f for f in fields if f not in rows[0]]
    if missing:
        raise KeyError(f"{path} rows lack field(s) {missing}; they have {sorted(rows[0])}")


def gsm8k_final_answer(answer: str) -> str | None:
    """The number after ``####`` in a GSM8K answer, thousands separators removed."""
    match = re.search(r"####\s*(-?[0-9.,]+)", answer)
    return match.group(1).replace(",", "").rstrip(".") if match else None


def last_boxed_only_string(text: str) -> str | None:
    """The last ``\\boxed{...}`` (or ``\\fbox{...}``, or ``\\boxed x``) in ``text``, braces balanced."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    if text.startswith("\\boxed ", start):
        rest = text[start + len("\\boxed ") :]
        return "\\boxed " + rest.split("$")[0].strip()
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[start : i + 1]
    return None


def remove_boxed(boxed: str) -> str:
    for prefix in ("\\boxed ", "\\boxed{", "\\fbox{"):
        if boxed.startswith(prefix):
            inner = boxed[len(prefix) :]
            return inner if prefix.endswith(" ") else inner[:-1]
    raise ValueError(f"not a boxed expression: {boxed!r}")


def write_parquet(rows: list[dict], path: str) -> str:
    """Write rows to ``path`` via a temporary file renamed into place."""
    path = os.path.expanduser(path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    pq.write_table(pa.Table.from_pylist(rows), tmp)
    os.replace(tmp, path)
    return path


def convert_local_files_cli(description: str, to_rows, default_local_dir: str, argv=None) -> list[str]:
    """The command line shared by the preprocess scripts that convert a file the user already has.

    ``--input_file`` (one file, with ``--split``) or ``--local_dataset_path`` (a folder of *train*/*test* files);
    ``to_rows(records, split, path)`` turns raw records into verl-schema rows, written to ``<local_dir>/<split>.parquet``.
    """
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--local_dataset_path", help="directory holding *train* / *test* files")
    src.add_argument("--input_file", help="one .jsonl/.json/.parquet file")
    parser.add_argument("--split", default="train", help="split name for --input_file (train or test)")
    parser.add_argument("--local_dir", default=default_local_dir)
    args = parser.parse_args(argv)
    try:  # read and convert everything before writing anything: a bad input leaves no partial output
        sources = {args.split: args.input_file} if args.input_file else find_split_files(args.local_dataset_path)
        converted = {split: (to_rows(read_records(path), split, path), path) for split, path in sources.items()}
    except (FileNotFoundError, ValueError) as err:
        parser.error(str(err))  # one line naming the file, exit code 2
    written = []
    for split, (rows, path) in converted.items():
        written.append(write_parquet(rows, os.path.join(os.path.expanduser(args.local_dir), f"{split}.parquet")))
        print(f"wrote {written[-1]} ({len(rows)} rows from {path})")
    return written
