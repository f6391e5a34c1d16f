"""Write tool-use conversations for a supervised warm start before GRPO with the calculator tool.

    python examples/multiturn/calculator_sft_data.py --local_dir ~/data/arithmetic_tool_sft \\
        --exclude ~/data/arithmetic_tool/test.parquet --train_size 2048 --val_size 64

Each row has a ``messages`` column (read by the SFT trainer with ``data.multiturn.enable=True``; the loss is on the
assistant turns only, so the tool result is context, never a target). A *tool* trace is what a ``tool_agent``
episode on the same problem looks like when the model uses the calculator well::

    user       123*45=                      (the same prompt as examples/multiturn/calculator_data.py writes)
    assistant  <tool_call>{"name": "calculator", "arguments": {"expression": "123*45"}}</tool_call>
    tool       5535
    assistant  5535

A share of the rows (``--direct_share``) are *direct* traces that answer without the tool (``user -> assistant
5535``), so a model trained on them sometimes guesses instead of calling; GRPO then has something to learn.
The problems come from their own seed and skip every expression found in the ``--exclude`` parquet files (the RL
test split), so the warm start never sees a validation problem. The model's first turn does not depend on the
system prompt in the embedded chat template, but pass ``--no_system_prompt`` here exactly when it is passed to
``calculator_data.py``, so that the prompts match.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys

# calculator_data.py (same folder) owns the RL prompt format; run as a script, this folder is on sys.path already,
# and the line below makes the import work when this file is loaded from elsewhere (tests).
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from calculator_data import SYSTEM  # noqa: E402

from verl.utils.dataset.preprocess_utils import read_records, write_parquet  # noqa: E402
from verl.utils.embedded.arithmetic import DATA_SOURCE, ArithmeticConfig, generate_problem  # noqa: E402

TOOL_NAME = "calculator"


def tool_call_text(expression: str) -> str:
    """The assistant turn that calls the calculator (Hermes format, the one the tool parser reads)."""
    return "<tool_call>" + json.dumps({"name": TOOL_NAME, "arguments": {"expression": expression}}) + "</tool_call>"


def conversation(expression: str, answer: int, use_tool: bool, system: bool) -> list[dict]:
    messages = [{"role": "system", "content": SYSTEM}] if system else []
    messages.append({"role": "user", "content": expression + "="})
    if use_tool:
        messages += [{"role": "assistant", "content": tool_call_text(expression)},
                     {"role": "tool", "content": str(answer)}]
    messages.append({"role": "assistant", "content": str(answer)})
    return messages


def excluded_expressions(paths: list[str]) -> set[str]:
    """Expressions of the rows in ``paths`` (``extra_info.expression``, as calculator_data.py writes them)."""
    out = set()
    for path in paths:
        for n, row in enumerate(read_records(path)):
            expression = (row.get("extra_info") or {}).get("expression")
            if not expression:
                raise ValueError(f"{path}, row {n}: no extra_info.expression; --exclude takes files written by "
                                 "examples/multiturn/calculator_data.py")
            out.add(str(expression))
    return out


def sft_rows(n: int, split: str, rng: random.Random, config: ArithmeticConfig, exclude: set[str],
             direct_share: float, system: bool) -> list[dict]:
    """``n`` conversations on problems not in ``exclude``; each expression is added to ``exclude`` once used,
    so successive calls (train, then val) never share a problem."""
    rows, tries = [], 0
    while len(rows) < n:
        tries += 1
        if tries > 100 * n + 1000:
            raise ValueError(f"could only draw {len(rows)} of {n} new problems with {config}; ask for fewer rows or "
                             "allow more digits (--max_digits)")
        expression, answer = generate_problem(rng, config)
        if expression in exclude:
            continue
        exclude.add(expression)
        use_tool = rng.random() >= direct_share
        rows.append({
            "data_source": DATA_SOURCE,
            "messages": conversation(expression, answer, use_tool, system),
            "extra_info": {"split": split, "index": len(rows), "expression": expression, "answer": str(answer),
                           "kind": "tool" if use_tool else "direct"},
        })
    return rows


def main(argv=None) -> list[str]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--local_dir", default="~/data/arithmetic_tool_sft")
    parser.add_argument("--train_size", type=int, default=2048)
    parser.add_argument("--val_size", type=int, default=64)
    parser.add_argument("--seed", type=int, default=1000, help="problem seed (calculator_data.py uses 0 and 1)")
    parser.add_argument("--min_digits", type=int, default=1, help="fewest operand digits, as in calculator_data.py")
    parser.add_argument("--max_digits", type=int, default=3, help="most operand digits, as in calculator_data.py")
    parser.add_argument("--direct_share", type=float, default=0.0,
                        help="share of rows that answer without calling the tool (0..1)")
    parser.add_argument("--exclude", nargs="*", default=[],
                        help="parquet files from calculator_data.py whose problems must not appear (the test split)")
    parser.add_argument("--no_system_prompt", action="store_true", help="as in calculator_data.py")
    args = parser.parse_args(argv)
    if not 0.0 <= args.direct_share <= 1.0:
        parser.error(f"--direct_share must be in [0, 1], got {args.direct_share}")
    if args.train_size < 1 or args.val_size < 0:
        parser.error("--train_size must be >= 1 and --val_size >= 0")
    config = ArithmeticConfig(min_digits=args.min_digits, max_digits=args.max_digits, operators="*")
    try:
        config.validate()
    except ValueError as err:
        parser.error(str(err))
    try:
        exclude = excluded_expressions(args.exclude)
    except (OSError, ValueError) as err:
        parser.exit(2, f"error: {err}\n")
    rng = random.Random(args.seed)
    out = os.path.expanduser(args.local_dir)
    written = []
    for split, size in (("train", args.train_size), ("val", args.val_size)):
        if size == 0:
            continue
        try:
            rows = sft_rows(size, split, rng, config, exclude, args.direct_share, not args.no_system_prompt)
        except ValueError as err:
            parser.exit(2, f"error: {err}\n")
        path = os.path.join(out, f"{split}.parquet")
        write_parquet(rows, path)
        written.append(path)
    print(f"wrote {args.train_size} train and {args.val_size} val conversations to {out}")
    return written


if __name__ == "__main__":
    main()
