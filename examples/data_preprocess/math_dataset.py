"""Convert a local copy of the MATH dataset (fields ``problem`` and ``solution``) to verl-schema parquet.

No dataset hub is contacted: point the script at files you already have.

    python examples/data_preprocess/math_dataset.py --local_dataset_path ~/datasets/MATH --local_dir ~/data/math
    python examples/data_preprocess/math_dataset.py --input_file test.jsonl --split test --local_dir ~/data/math

Rows: data_source ``DigitalLearningGmbH/MATH-lighteval``, the problem plus verl's instruction (answer within
\\boxed{}), ground truth = the content of the last \\boxed{...} in the reference solution.
"""

from __future__ import annotations

from verl.utils.dataset.preprocess_utils import (
    convert_local_files_cli,
    MATH_INSTRUCTION,
    last_boxed_only_string,
    remove_boxed,
    require_fields,
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
    return convert_local_files_cli(__doc__, to_rows, "~/data/math", argv)


if __name__ == "__main__":
    main()
