"""Preprocess GSM8K (fields ``question`` and ``answer``) into verl-schema parquet, with verl's command line.

    # a local copy of the dataset (e.g. a clone of the hub repo: main/train-00000-of-00001.parquet, ...)
    python examples/data_preprocess/gsm8k.py --local_dataset_path ~/datasets/gsm8k --local_save_dir ~/data/gsm8k
    # one file you already have
    python examples/data_preprocess/gsm8k.py --input_file test.jsonl --split test --local_save_dir ~/data/gsm8k
    # no local copy: downloads openai/gsm8k with `datasets` (needs network; refused when HF_HUB_OFFLINE=1)
    python examples/data_preprocess/gsm8k.py --local_save_dir ~/data/gsm8k

``--local_dataset_path`` is a directory searched for *train* / *test* .jsonl/.json/.parquet files. ``--local_dir``
is the older name of ``--local_save_dir`` and still works. Rows: data_source ``openai/gsm8k``, the question plus
verl's instruction, ground truth = the number after ``####`` (scored by verl's GSM8K rule reward).
"""

from __future__ import annotations

import argparse
import os
import sys

from verl.utils.dataset.preprocess_utils import (
    find_split_files,
    GSM8K_INSTRUCTION,
    gsm8k_final_answer,
    read_records,
    require_fields,
    write_parquet,
)

DATA_SOURCE = "openai/gsm8k"
DEFAULT_SAVE_DIR = "~/data/gsm8k"


def to_rows(records: list[dict], split: str, path: str) -> list[dict]:
    require_fields(records, ("question", "answer"), path)
    rows = []
    for index, rec in enumerate(records):
        truth = gsm8k_final_answer(rec["answer"])
        if truth is None:
            raise ValueError(f"{path}, row {index}: the answer has no '#### <number>' line")
        rows.append(
            {
                "data_source": DATA_SOURCE,
                "prompt": [{"role": "user", "content": rec["question"] + " " + GSM8K_INSTRUCTION}],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": truth},
                "extra_info": {"split": split, "index": index, "answer": rec["answer"], "question": rec["question"]},
            }
        )
    return rows


def _hub_records() -> dict[str, tuple[list[dict], str]]:
    """``{split: (records, "openai/gsm8k")}`` downloaded with ``datasets`` (verl's default source)."""
    if any(os.environ.get(v, "0") not in ("", "0") for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")):
        raise SystemExit(
            "gsm8k.py: no local copy of GSM8K given and the hub is off (HF_HUB_OFFLINE / HF_DATASETS_OFFLINE is "
            "set). Pass --local_dataset_path DIR (a folder with *train* / *test* .parquet/.jsonl/.json files) or "
            "--input_file FILE --split test|train."
        )
    import datasets  # heavy; only needed for the download path

    try:
        loaded = datasets.load_dataset(DATA_SOURCE, "main")
    except Exception as err:
        raise SystemExit(f"gsm8k.py: could not download {DATA_SOURCE} ({type(err).__name__}: {err}); pass "
                         "--local_dataset_path DIR with a local copy instead") from err
    return {split: (loaded[split].to_list(), DATA_SOURCE) for split in ("train", "test")}


def main(argv=None) -> list[str]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = parser.add_mutually_exclusive_group()
    src.add_argument("--local_dataset_path", default=None, help="directory holding *train* / *test* files")
    src.add_argument("--input_file", default=None, help="one .jsonl/.json/.parquet file (see --split)")
    parser.add_argument("--split", default="train", choices=("train", "test"), help="split name for --input_file")
    parser.add_argument("--local_save_dir", default=None, help=f"output directory (default {DEFAULT_SAVE_DIR})")
    parser.add_argument("--local_dir", default=None, help="older name of --local_save_dir")
    parser.add_argument("--hdfs_dir", default=None, help="not supported: copy the output directory yourself")
    args = parser.parse_args(argv)
    if args.hdfs_dir is not None:
        parser.error("--hdfs_dir is not supported; write with --local_save_dir and copy the directory to HDFS yourself")
    if args.local_dir is not None and args.local_save_dir is not None and args.local_dir != args.local_save_dir:
        parser.error("--local_dir and --local_save_dir name the same output directory; give only one")
    save_dir = os.path.expanduser(args.local_save_dir or args.local_dir or DEFAULT_SAVE_DIR)

    try:
        if args.input_file:
            sources = {args.split: (read_records(args.input_file), args.input_file)}
        elif args.local_dataset_path:
            found = find_split_files(args.local_dataset_path)
            sources = {split: (read_records(path), path) for split, path in found.items()}
        else:
            sources = _hub_records()
        # convert everything before writing anything, so a bad row leaves no partial output
        converted = {split: to_rows(records, split, path) for split, (records, path) in sources.items()}
    except (FileNotFoundError, ValueError) as err:
        parser.error(str(err))  # one line naming the file, exit code 2
    written = []
    for split, rows in converted.items():
        written.append(write_parquet(rows, os.path.join(save_dir, f"{split}.parquet")))
        print(f"wrote {written[-1]} ({len(rows)} rows from {sources[split][1]})")
    return written


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
