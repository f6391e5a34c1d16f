"""Convert a local copy of GSM8K (fields ``question`` and ``answer``) to verl-schema parquet.

No dataset hub is contacted: point the script at files you already have.

    python examples/data_preprocess/gsm8k.py --local_dataset_path ~/datasets/gsm8k --local_dir ~/data/gsm8k
    python examples/data_preprocess/gsm8k.py --input_file test.jsonl --split test --local_dir ~/data/gsm8k

``--local_dataset_path`` is a directory searched for *train* / *test* .jsonl/.json/.parquet files (the HF
layout ``main/train-00000-of-00001.parquet`` works); ``--input_file`` converts one file into ``<split>.parquet``.
Rows: data_source ``openai/gsm8k``, the question plus verl's instruction, ground truth = the number after ####.
"""

from __future__ import annotations

import argparse
import os

from verl.utils.dataset.preprocess_utils import (
    GSM8K_INSTRUCTION,
    find_split_files,
    gsm8k_final_answer,
    read_records,
    require_fields,
    write_parquet,
)

DATA_SOURCE = "openai/gsm8k"


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


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--local_dataset_path", help="directory holding *train* / *test* files")
    src.add_argument("--input_file", help="one .jsonl/.json/.parquet file")
    parser.add_argument("--split", default="train", help="split name for --input_file (train or test)")
    parser.add_argument("--local_dir", default="~/data/gsm8k")
    args = parser.parse_args(argv)
    sources = {args.split: args.input_file} if args.input_file else find_split_files(args.local_dataset_path)
    written = []
    for split, path in sources.items():
        rows = to_rows(read_records(path), split, path)
        written.append(write_parquet(rows, os.path.join(os.path.expanduser(args.local_dir), f"{split}.parquet")))
        print(f"wrote {written[-1]} ({len(rows)} rows from {path})")
    return written


if __name__ == "__main__":
    main()
