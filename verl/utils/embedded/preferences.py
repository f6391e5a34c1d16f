"""Arithmetic preference data (correct vs wrong answer) for DPO-family recipes and reward models.

    python -m verl.utils.embedded.preferences --out ~/data/arith_pref [--train 512] [--test 128] [--max_digits 1]

writes ``train.parquet`` and ``test.parquet`` (test expressions never appear in train) with columns
``prompt`` (chat list), ``chosen`` (the correct answer), ``rejected`` (a wrong one: the answer shifted by
1..9 either way), plus ``data_source`` / ``reward_model.ground_truth`` so rule rewards and RL prompts work on the
same files, ``kto_train.parquet`` (``prompt``, ``completion``, ``label``) for KTO and ``sft_train.parquet``
(``prompt`` string, ``response`` = the chosen answer) for the supervised warm start that DPO usually follows.
Same seed, same rows.
"""

from __future__ import annotations

import argparse
import os
import random
import sys

import pandas as pd

from verl.utils.embedded.arithmetic import DATA_SOURCE, ABILITY, ArithmeticConfig, generate_problem

__all__ = ["make_preference_rows", "make_kto_rows", "write_preference_files"]


def _wrong(rng: random.Random, answer: int) -> int:
    return answer + rng.choice([-1, 1]) * rng.randint(1, 9)


def make_preference_rows(n: int, split: str = "train", seed: int = 0, config: ArithmeticConfig | None = None,
                         exclude: set[str] | frozenset = frozenset(), distinct: bool = True) -> list[dict]:
    """``n`` pairs (expressions in ``exclude`` are skipped; ``distinct`` keeps one row per expression)."""
    cfg = config or ArithmeticConfig()
    cfg.validate()
    rng = random.Random(seed)
    rows, seen = [], set(exclude)
    for _ in range(200 * n):
        if len(rows) == n:
            break
        expression, answer = generate_problem(rng, cfg)
        if expression in seen:
            continue
        if distinct:
            seen.add(expression)
        rows.append({"data_source": DATA_SOURCE, "ability": ABILITY,
                     "prompt": [{"role": "user", "content": expression + "="}],
                     "chosen": str(answer), "rejected": str(_wrong(rng, answer)),
                     "reward_model": {"style": "rule", "ground_truth": str(answer)},
                     "extra_info": {"split": split, "index": len(rows), "expression": expression}})
    if len(rows) < n:
        raise ValueError(f"only {len(rows)} distinct problems for {n} rows with {cfg}; widen the knobs "
                         "(max_digits, operators, max_terms) or ask for fewer rows")
    return rows


def make_kto_rows(pairs: list[dict]) -> list[dict]:
    """Unpaired KTO rows from pairs: the chosen answer (label true) and the rejected one (label false)."""
    out = []
    for row in pairs:
        out.append({"prompt": row["prompt"], "completion": row["chosen"], "label": True})
        out.append({"prompt": row["prompt"], "completion": row["rejected"], "label": False})
    return out


def write_preference_files(out_dir: str, n_train: int = 512, n_test: int = 128, seed: int = 0,
                           config: ArithmeticConfig | None = None) -> dict[str, str]:
    """Write train/test/kto_train/sft_train parquet files (test first, so train excludes its expressions)."""
    out_dir = os.path.expanduser(out_dir)
    os.makedirs(out_dir, exist_ok=True)
    test = make_preference_rows(n_test, "test", seed + 1, config)
    train = make_preference_rows(n_train, "train", seed, config,
                                 exclude={r["extra_info"]["expression"] for r in test})
    sft = [{"prompt": r["extra_info"]["expression"] + "=", "response": r["chosen"]} for r in train]
    names = ("train", "test", "kto_train", "sft_train")
    paths = {name: os.path.join(out_dir, f"{name}.parquet") for name in names}
    for name, rows in zip(names, (train, test, make_kto_rows(train), sft)):
        tmp = paths[name] + ".tmp"
        pd.DataFrame(rows).to_parquet(tmp)
        os.replace(tmp, paths[name])
    return paths


def main(argv: list[str] | None = None) -> dict[str, str]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--train", type=int, default=512)
    parser.add_argument("--test", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max_digits", type=int, default=2)
    parser.add_argument("--operators", default="+-")
    args = parser.parse_args(argv)
    cfg = ArithmeticConfig(max_digits=args.max_digits, operators=args.operators)
    try:
        paths = write_preference_files(args.out, args.train, args.test, args.seed, cfg)
    except ValueError as err:
        parser.exit(2, f"error: {err}\n")
    print("\n".join(paths.values()))
    return paths


if __name__ == "__main__":
    main(sys.argv[1:])
