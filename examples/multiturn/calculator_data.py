"""Write the embedded arithmetic task as multi-turn tool-use data (verl's parquet schema plus ``agent_name``).

    python examples/multiturn/calculator_data.py --local_dir ~/data/arithmetic_tool --train_size 512 --test_size 64

Every row has ``agent_name: tool_agent`` (so the agent loop may call tools) and
``extra_info.tools_kwargs.calculator.create_kwargs.ground_truth`` (the calculator tool rewards a call that
computes the answer). The system prompt shows the call syntax the tool parser reads
(``<tool_call>{"name": "calculator", "arguments": {"expression": "..."}}</tool_call>``).
"""

from __future__ import annotations

import argparse
import os

from verl.utils.dataset.preprocess_utils import write_parquet
from verl.utils.embedded.arithmetic import ArithmeticConfig, make_rl_rows

SYSTEM = ('Use the calculator: <tool_call>{"name": "calculator", "arguments": {"expression": "..."}}</tool_call>, '
          'then give the answer.')


def tool_rows(n: int, split: str, seed: int, config: ArithmeticConfig, system: bool = True,
              agent_name: str = "tool_agent") -> list[dict]:
    rows = make_rl_rows(n, split=split, seed=seed, config=config)
    for row in rows:
        if system:
            row["prompt"] = [{"role": "system", "content": SYSTEM}] + row["prompt"]
        row["agent_name"] = agent_name
        truth = row["reward_model"]["ground_truth"]
        row["extra_info"]["tools_kwargs"] = {"calculator": {"create_kwargs": {"ground_truth": truth}}}
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--local_dir", default="~/data/arithmetic_tool")
    parser.add_argument("--train_size", type=int, default=512)
    parser.add_argument("--test_size", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--min_digits", type=int, default=1, help="fewest operand digits")
    parser.add_argument("--max_digits", type=int, default=3, help="most operand digits")
    parser.add_argument("--no_system_prompt", action="store_true", help="omit the tool instructions (short prompts)")
    parser.add_argument("--agent_name", default="tool_agent", help="the agent loop every row runs")
    args = parser.parse_args(argv)
    config = ArithmeticConfig(min_digits=args.min_digits, max_digits=args.max_digits, operators="*")
    out = os.path.expanduser(args.local_dir)
    system = not args.no_system_prompt
    for split, size, seed in (("train", args.train_size, args.seed), ("test", args.test_size, args.seed + 1)):
        rows = tool_rows(size, split, seed, config, system, args.agent_name)
        write_parquet(rows, os.path.join(out, f"{split}.parquet"))
    print(f"wrote {args.train_size} train and {args.test_size} test rows to {out}")


if __name__ == "__main__":
    main()
