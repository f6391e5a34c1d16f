"""Convert a local copy of GSM8K (fields ``question`` and ``answer``) to verl-schema parquet.

No dataset hub is contacted: point the script at files you already have.

    python examples/data_preprocess/gsm8k.py --local_dataset_path ~/datasets/gsm8k --local_dir ~/data/gsm8k
    python examples/data_preprocess/gsm8k.py --input_file test.jsonl --split test --local_dir ~/data/gsm8k

``--local_dataset_path`` is a directory searched for *train* / *test* .jsonl/.json/.parquet files (the HF
layout ``main/train-00000-of-00001.parquet`` works); ``--input_file`` converts one file into ``<split>.parquet``.
Rows: data_source ``openai/gsm8k``, the question plus verl's instruction, ground truth = the number after ####.
"""

from __future__ import annotations

from verl.utils.dataset.preprocess_utils import (
    convert_local_files_cli,
    GSM8K_INSTRUCTION,
    gsm8k_final_answer,
    require_fields,
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
    return convert_local_files_cli(__doc__, to_rows, "~/data/gsm8k", argv)


if __name__ == "__main__":
    main()
