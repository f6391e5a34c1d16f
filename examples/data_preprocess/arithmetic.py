"""Write the embedded integer-arithmetic task as verl-schema parquet (train.parquet, test.parquet).

    python examples/data_preprocess/arithmetic.py --local_dir ~/data/arithmetic \
        --train_size 5000 --test_size 500 --max_digits 2 --operators +- [--sft]

With --sft the same problems are also written as prompt/response pairs to <local_dir>/sft/{train,test}.parquet
for the SFT warm start (verl.trainer.fsdp_sft_trainer with data.prompt_key=prompt data.response_key=response).
Test problems never repeat a training expression when the knobs leave enough distinct problems.
"""

from __future__ import annotations

import argparse
import os

from verl.utils.dataset.preprocess_utils import write_parquet
from verl.utils.embedded.arithmetic import ArithmeticConfig, make_rl_rows, make_sft_rows


def _test_rows(make, size, seed, config, train_expressions):
    """``size`` rows whose expressions are not in the training set (falls back to repeats if it must)."""
    rows, attempt = [], 0
    while len(rows) < size and attempt < 20:
        for row in make(size * 2, split="test", seed=seed + 1000 * attempt, config=config):
            if row["extra_info"]["expression"] not in train_expressions and len(rows) < size:
                rows.append(row)
        attempt += 1
    if len(rows) < size:
        rows += make(size - len(rows), split="test", seed=seed + 7919, config=config)
    for index, row in enumerate(rows):
        row["extra_info"]["index"] = index
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--local_dir", default="~/data/arithmetic")
    parser.add_argument("--train_size", type=int, default=5000)
    parser.add_argument("--test_size", type=int, default=500)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--min_digits", type=int, default=1)
    parser.add_argument("--max_digits", type=int, default=2)
    parser.add_argument("--operators", default="+-", help="subset of +-*/ (division only where exact)")
    parser.add_argument("--min_terms", type=int, default=2)
    parser.add_argument("--max_terms", type=int, default=2)
    parser.add_argument("--paren_prob", type=float, default=0.0, help="chance of parentheses (3+ terms)")
    parser.add_argument("--no_negative", action="store_true", help="only problems with a non-negative answer")
    parser.add_argument("--sft", action="store_true", help="also write sft/train.parquet and sft/test.parquet")
    args = parser.parse_args(argv)

    config = ArithmeticConfig(
        min_digits=args.min_digits,
        max_digits=args.max_digits,
        operators=args.operators,
        min_terms=args.min_terms,
        max_terms=args.max_terms,
        allow_negative=not args.no_negative,
        paren_prob=args.paren_prob,
    )
    try:
        config.validate()
    except ValueError as err:
        parser.error(str(err))
    local_dir = os.path.expanduser(args.local_dir)
    train = make_rl_rows(args.train_size, split="train", seed=args.seed, config=config)
    seen = {row["extra_info"]["expression"] for row in train}
    test = _test_rows(make_rl_rows, args.test_size, args.seed + 1, config, seen)
    written = [
        write_parquet(train, os.path.join(local_dir, "train.parquet")),
        write_parquet(test, os.path.join(local_dir, "test.parquet")),
    ]
    if args.sft:
        sft_train = make_sft_rows(args.train_size, split="train", seed=args.seed, config=config)
        sft_test = _test_rows(make_sft_rows, args.test_size, args.seed + 1, config, seen)
        written += [
            write_parquet(sft_train, os.path.join(local_dir, "sft", "train.parquet")),
            write_parquet(sft_test, os.path.join(local_dir, "sft", "test.parquet")),
        ]
    for path in written:
        print(f"wrote {path}")
    return written


if __name__ == "__main__":
    main()
