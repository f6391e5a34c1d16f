"""GSM8K-style problems generated offline by reasoning-gym's ``gsm_symbolic`` task, as verl-schema parquet.

    python examples/data_preprocess/gsm_symbolic.py --local_dir ~/data/gsm_symbolic --train_size 2000 --test_size 200

Rows: data_source ``gsm_symbolic``, the question plus verl's GSM8K instruction (final answer after ####),
ground truth = reasoning-gym's integer answer. Train and test use different seeds (``--seed`` and ``--seed + 1``).
"""

from __future__ import annotations

import argparse
import os

from verl.utils.dataset.preprocess_utils import GSM8K_INSTRUCTION, write_parquet

DATA_SOURCE = "gsm_symbolic"


def make_rows(size: int, seed: int, split: str) -> list[dict]:
    try:
        import reasoning_gym
    except ImportError as err:
        raise SystemExit("reasoning-gym is not installed: pip install reasoning-gym") from err
    rows = []
    for index, entry in enumerate(reasoning_gym.create_dataset("gsm_symbolic", size=size, seed=seed)):
        meta = entry.get("metadata", {})
        rows.append(
            {
                "data_source": DATA_SOURCE,
                "prompt": [{"role": "user", "content": entry["question"] + " " + GSM8K_INSTRUCTION}],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": str(entry["answer"]).strip()},
                "extra_info": {
                    "split": split,
                    "index": index,
                    "source_index": meta.get("source_index"),
                    "difficulty": meta.get("difficulty"),
                },
            }
        )
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--local_dir", default="~/data/gsm_symbolic")
    parser.add_argument("--train_size", type=int, default=2000)
    parser.add_argument("--test_size", type=int, default=200)
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args(argv)
    local_dir = os.path.expanduser(args.local_dir)
    written = []
    for split, size, seed in (("train", args.train_size, args.seed), ("test", args.test_size, args.seed + 1)):
        written.append(write_parquet(make_rows(size, seed, split), os.path.join(local_dir, f"{split}.parquet")))
        print(f"wrote {written[-1]} ({size} rows)")
    return written


if __name__ == "__main__":
    main()
