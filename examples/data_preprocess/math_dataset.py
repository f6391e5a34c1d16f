"""Convert a local copy of the MATH dataset (fields ``problem`` and ``solution``) to verl-schema parquet.

No dataset hub is contacted: point the script at files you already have.

    python examples/data_preprocess/math_dataset.py --local_dataset_path ~/datasets/MATH --local_dir ~/data/math
    python examples/data_preprocess/math_dataset.py --input_file test.jsonl --split test --local_dir ~/data/math

Rows: data_source ``DigitalLearningGmbH/MATH-lighteval``, the problem plus verl's instruction (answer within
\\boxed{}), ground truth = the content of the last \\boxed{...} in the reference solution.
"""

from __future__ import annotations

import argparse
import os

from verl.utils.dataset.preprocess_utils import (
    MATH_INSTRUCTION,
    find_split_files,
    last_boxed_only_string,
    read_records,
    remove_boxed,
    require_fields,
    write_parquet,
)

DATA_SOURCE = "DigitalLearningGmbH/MATH-lighteval"


def to_rows(records: list[dict], split: str, path: str) -> list[dict]:
    require_fields(records, ("problem", "solution"), path)
    rows = []
    for index, rec in enumerate(records):
        boxed = last_boxed_only_string(rec["solution"])
        if boxed is None:
            raise ValueError(f"{path}, row {index}: the solution has no \\boxed{{...}} answer")
        rows.append(
            {
                "data_source": DATA_SOURCE,
                "prompt": [{"role": "user", "content": rec["problem"] + " " + MATH_INSTRUCTION}],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": remove_boxed(boxed)},
                "extra_info": {"split": split, "index": index},
            }
        )
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--local_dataset_path", help="directory holding *train* / *test* files")
    src.add_argument("--input_file", help="one .jsonl/.json/.parquet file")
    parser.add_argument("--split", default="train", help="split name for --input_file (train or test)")
    parser.add_argument("--local_dir", default="~/data/math")
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
