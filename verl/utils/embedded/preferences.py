"""Arithmetic preference data (correct vs wrong answer) for DPO-family recipes and reward models.

    python -m verl.utils.embedded.preferences --out ~/data/arith_pref [--train 512] [--test 128] [--max_digits 1]
        [--rejected_per_prompt 1]

writes ``train.parquet`` and ``test.parquet`` (test expressions never appear in train) with columns
``prompt`` (chat list), ``chosen`` (the correct answer), ``rejected`` (a wrong one: the answer shifted by
1..9 either way; ``--rejected_per_prompt K`` writes K pairs per expression with K different wrong answers),
plus ``data_source`` / ``reward_model.ground_truth`` so rule rewards and RL prompts work on the same files,
``kto_train.parquet`` / ``kto_test.parquet`` (``prompt``, ``completion``, ``label``: the same pairs unpaired,
the right answer once per expression with label true and each wrong answer with label false) for KTO
(``dpo.loss_type=kto``) and ``sft_train.parquet`` (``prompt``
string, ``response`` = the chosen answer, one row per expression) for the supervised warm start that DPO usually
follows. Same seed, same rows.
"""

from __future__ import annotations

import argparse
import os
import random
import sys

import pandas as pd

from verl.utils.embedded.arithmetic import DATA_SOURCE, ABILITY, ArithmeticConfig, generate_problem

__all__ = ["make_preference_rows", "make_kto_rows", "write_preference_files"]


MAX_SHIFT = 9  # a wrong answer is the right one shifted by 1..MAX_SHIFT either way


def _wrong_answers(rng: random.Random, answer: int, k: int) -> list[int]:
    """``k`` different wrong answers, each the answer shifted by 1..MAX_SHIFT up or down."""
    if not 1 <= k <= 2 * MAX_SHIFT:
        raise ValueError(f"rejected_per_prompt={k}: choose 1..{2 * MAX_SHIFT} (there are {2 * MAX_SHIFT} wrong "
                         f"answers within {MAX_SHIFT} of the right one)")
    if k == 1:  # the original single draw, kept so existing seeds give the same files
        return [answer + rng.choice([-1, 1]) * rng.randint(1, MAX_SHIFT)]
    shifts = [s for s in range(-MAX_SHIFT, MAX_SHIFT + 1) if s]
    return [answer + s for s in rng.sample(shifts, k)]


def make_preference_rows(n: int, split: str = "train", seed: int = 0, config: ArithmeticConfig | None = None,
                         exclude: set[str] | frozenset = frozenset(), distinct: bool = True,
                         rejected_per_prompt: int = 1) -> list[dict]:
    """Pairs for ``n`` expressions, ``rejected_per_prompt`` rows each (the same chosen answer against that
    many different wrong ones). Expressions in ``exclude`` are skipped; ``distinct`` draws each expression once."""
    cfg = config or ArithmeticConfig()
    cfg.validate()
    rng = random.Random(seed)
    rows, seen, drawn = [], set(exclude), 0
    for _ in range(200 * n):
        if drawn == n:
            break
        expression, answer = generate_problem(rng, cfg)
        if expression in seen:
            continue
        if distinct:
            seen.add(expression)
        drawn += 1
        for wrong in _wrong_answers(rng, answer, rejected_per_prompt):
            rows.append({"data_source": DATA_SOURCE, "ability": ABILITY,
                         "prompt": [{"role": "user", "content": expression + "="}],
                         "chosen": str(answer), "rejected": str(wrong),
                         "reward_model": {"style": "rule", "ground_truth": str(answer)},
                         "extra_info": {"split": split, "index": len(rows), "expression": expression}})
    if drawn < n:
        raise ValueError(f"only {drawn} distinct problems for {n} expressions with {cfg}; widen the knobs "
                         "(max_digits, operators, max_terms) or ask for fewer rows")
    return rows


def make_kto_rows(pairs: list[dict]) -> list[dict]:
    """Unpaired KTO rows from pairs: the chosen answer (label true) and the rejected one (label false); a chosen
    answer shared by several pairs of one prompt appears once."""
    out, seen = [], set()
    for row in pairs:
        key = (str(row["prompt"]), row["chosen"])
        if key not in seen:
            seen.add(key)
            out.append({"prompt": row["prompt"], "completion": row["chosen"], "label": True})
        out.append({"prompt": row["prompt"], "completion": row["rejected"], "label": False})
    return out


def write_preference_files(out_dir: str, n_train: int = 512, n_test: int = 128, seed: int = 0,
                           config: ArithmeticConfig | None = None, rejected_per_prompt: int = 1,
                           test_rejected_per_prompt: int = 1) -> dict[str, str]:
    """Write train/test/kto_train/kto_test/sft_train parquet files (test first, so train excludes its expressions).
    ``n_train`` / ``n_test`` count expressions; each gets ``rejected_per_prompt`` (train) or
    ``test_rejected_per_prompt`` (test) pairs. ``sft_train`` has one row per training expression."""
    out_dir = os.path.expanduser(out_dir)
    os.makedirs(out_dir, exist_ok=True)
    test = make_preference_rows(n_test, "test", seed + 1, config, rejected_per_prompt=test_rejected_per_prompt)
    train = make_preference_rows(n_train, "train", seed, config, rejected_per_prompt=rejected_per_prompt,
                                 exclude={r["extra_info"]["expression"] for r in test})
    expressions = dict.fromkeys(r["extra_info"]["expression"] for r in train)  # ordered, one per expression
    answers = {r["extra_info"]["expression"]: r["chosen"] for r in train}
    sft = [{"prompt": e + "=", "response": answers[e]} for e in expressions]
    names = ("train", "test", "kto_train", "kto_test", "sft_train")
    paths = {name: os.path.join(out_dir, f"{name}.parquet") for name in names}
    for name, rows in zip(names, (train, test, make_kto_rows(train), make_kto_rows(test), sft)):
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
    parser.add_argument("--rejected_per_prompt", type=int, default=1,
                        help="training pairs per expression, each with a different wrong answer")
    parser.add_argument("--test_rejected_per_prompt", type=int, default=1)
    args = parser.parse_args(argv)
    cfg = ArithmeticConfig(max_digits=args.max_digits, operators=args.operators)
    try:
        paths = write_preference_files(args.out, args.train, args.test, args.seed, cfg, args.rejected_per_prompt,
                                       args.test_rejected_per_prompt)
    except ValueError as err:
        parser.exit(2, f"error: {err}\n")
    print("\n".join(paths.values()))
    return paths


if __name__ == "__main__":
    main(sys.argv[1:])
