"""Short arithmetic problems (reasoning-gym's ``basic_arithmetic``: two terms, + and -) as verl-schema parquet, for
a real small model's first GRPO run on a CPU machine.

    python examples/data_preprocess/basic_arithmetic.py --local_save_dir ~/data/basic_arithmetic

Rows are shaped like ``gsm_symbolic.py``'s: the question plus verl's GSM8K instruction, ground truth = the integer
answer, ``data_source`` ``openai/gsm8k`` (the strict ``#### N`` rule), and ``extra_info.answer`` = a worked answer
``<expression> = N\\n#### N`` for an SFT warm start (``examples/sft/run_smollm2_gsm_symbolic_sft.sh`` with
``DATA_DIR`` pointing here). Train and test come from one deterministic sequence of distinct questions (train
first), so no test question appears in train.
"""

from __future__ import annotations

import argparse
import os

from gsm_symbolic import unique_entries  # the sibling script (this directory is on sys.path when run as a script)

from verl.utils.dataset.preprocess_utils import GSM8K_INSTRUCTION, write_parquet

DEFAULT_SAVE_DIR = "~/data/basic_arithmetic"


def worked_answer(question: str, answer: str) -> str:
    expression = question.removeprefix("Calculate ").rstrip(".").strip()
    return f"{expression} = {answer}\n#### {answer}"


def make_rows(entries: list[dict], split: str) -> list[dict]:
    rows = []
    for index, entry in enumerate(entries):
        answer = str(entry["answer"]).strip()
        rows.append({
            "data_source": "openai/gsm8k",
            "prompt": [{"role": "user", "content": entry["question"] + " " + GSM8K_INSTRUCTION}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": answer},
            "extra_info": {"split": split, "index": index, "dataset": "reasoning_gym/basic_arithmetic",
                           "question": entry["question"], "answer": worked_answer(entry["question"], answer)},
        })
    return rows


def main(argv=None) -> list[str]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--local_save_dir", default=DEFAULT_SAVE_DIR, help=f"output directory (default {DEFAULT_SAVE_DIR})")
    parser.add_argument("--train_size", type=int, default=3000)
    parser.add_argument("--test_size", type=int, default=200)
    parser.add_argument("--max_digits", type=int, default=2, help="digits per term (1-2 digits by default)")
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args(argv)
    if args.train_size < 1 or args.test_size < 1 or args.max_digits < 1:
        parser.error("--train_size, --test_size and --max_digits must be >= 1")
    save_dir = os.path.expanduser(args.local_save_dir)
    problems = unique_entries(args.train_size + args.test_size, args.seed, task="basic_arithmetic", min_terms=2,
                              max_terms=2, min_digits=1, max_digits=args.max_digits, operators=("+", "-"))
    written = []
    for split, entries in (("train", problems[: args.train_size]), ("test", problems[args.train_size:])):
        path = write_parquet(make_rows(entries, split), os.path.join(save_dir, f"{split}.parquet"))
        written.append(path)
        print(f"wrote {path} ({len(entries)} rows)")
    return written


if __name__ == "__main__":
    main()
