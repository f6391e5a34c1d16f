"""GSM8K-style problems generated offline by reasoning-gym's ``gsm_symbolic`` task, as verl-schema parquet.

    python examples/data_preprocess/gsm_symbolic.py --local_save_dir ~/data/gsm_symbolic --train_size 2000 --test_size 200

Rows: the question plus verl's GSM8K instruction (final answer after ``####``), ground truth = reasoning-gym's
integer answer. The output is deterministic for given sizes and ``--seed``: train comes from ``--seed``, test from
``--seed + 1``, and no test question appears in train (nor twice in one split).

``--data_source`` decides the reward the trainer and ``main_eval`` apply: ``openai/gsm8k`` (default) is verl's
GSM8K rule reward -- strict, the number after ``####`` must equal the answer; ``gsm_symbolic`` is a lenient scorer
that also accepts ``<answer>..</answer>``, ``\\boxed{}`` or the last number. ``extra_info.dataset`` always says
where the rows came from, and ``extra_info.answer`` holds the worked solution ending in ``#### N`` (the target of
an SFT warm start: ``data.response_key=extra_info data.response_dict_keys=[answer]``, as verl's GSM8K SFT example).
"""

from __future__ import annotations

import argparse
import os

from verl.utils.dataset.preprocess_utils import GSM8K_INSTRUCTION, write_parquet

DATA_SOURCES = ("openai/gsm8k", "gsm_symbolic")
DEFAULT_SAVE_DIR = "~/data/gsm_symbolic"


def unique_entries(size: int, seed: int, exclude: set[str] = frozenset(), task: str = "gsm_symbolic",
                   **task_kwargs) -> list[dict]:
    """The first ``size`` entries of reasoning-gym's ``task`` (seed ``seed``, ``task_kwargs``) whose question is
    new: not in ``exclude`` and not seen earlier. Draws a larger pool when duplicates leave it short."""
    try:
        import reasoning_gym  # optional dependency of this example only
    except ImportError as err:
        raise SystemExit("reasoning-gym is not installed: pip install reasoning-gym==0.1.25") from err
    pool = size + size // 8 + 16
    while True:
        seen, picked = set(exclude), []
        for entry in reasoning_gym.create_dataset(task, size=pool, seed=seed, **task_kwargs):
            if entry["question"] in seen:
                continue
            seen.add(entry["question"])
            picked.append(entry)
            if len(picked) == size:
                return picked
        if pool > 8 * size + 1000:
            raise SystemExit(f"{task}: could not find {size} distinct problems with seed {seed} "
                             f"(got {len(picked)}); ask for fewer")
        pool *= 2


def worked_solution(cot: str | None, answer: str) -> str:
    """reasoning-gym's worked solution with its final line made ``#### <answer>`` exactly as the ground truth is
    written: some templates end in ``#### 168.0``, which the strict rule scores 0 against ``168``."""
    steps = (cot or "").rsplit("####", 1)[0].rstrip()
    return f"{steps}\n#### {answer}" if steps else f"#### {answer}"


def make_rows(entries: list[dict], split: str, data_source: str) -> list[dict]:
    rows = []
    for index, entry in enumerate(entries):
        meta = entry.get("metadata", {})
        rows.append(
            {
                "data_source": data_source,
                "prompt": [{"role": "user", "content": entry["question"] + " " + GSM8K_INSTRUCTION}],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": str(entry["answer"]).strip()},
                "extra_info": {
                    "split": split,
                    "index": index,
                    "dataset": "reasoning_gym/gsm_symbolic",
                    "question": entry["question"],
                    # worked solution ending in "#### N" (reasoning-gym's answer_cot): the SFT warm-start target
                    "answer": worked_solution(meta.get("answer_cot"), str(entry["answer"]).strip()),
                    "source_index": meta.get("source_index"),
                    "difficulty": meta.get("difficulty"),
                },
            }
        )
    return rows


def main(argv=None) -> list[str]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--local_save_dir", default=None, help=f"output directory (default {DEFAULT_SAVE_DIR})")
    parser.add_argument("--local_dir", default=None, help="older name of --local_save_dir")
    parser.add_argument("--train_size", type=int, default=2000)
    parser.add_argument("--test_size", type=int, default=200)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--data_source", default=DATA_SOURCES[0], choices=DATA_SOURCES,
                        help="selects the reward (see above)")
    args = parser.parse_args(argv)
    if args.train_size < 0 or args.test_size < 1:
        parser.error("--train_size must be >= 0 and --test_size >= 1")
    if args.local_dir is not None and args.local_save_dir is not None and args.local_dir != args.local_save_dir:
        parser.error("--local_dir and --local_save_dir name the same output directory; give only one")
    save_dir = os.path.expanduser(args.local_save_dir or args.local_dir or DEFAULT_SAVE_DIR)

    train = unique_entries(args.train_size, args.seed)
    test = unique_entries(args.test_size, args.seed + 1, exclude={e["question"] for e in train})
    written = []
    for split, entries in (("train", train), ("test", test)):
        path = write_parquet(make_rows(entries, split, args.data_source), os.path.join(save_dir, f"{split}.parquet"))
        written.append(path)
        print(f"wrote {path} ({len(entries)} rows)")
    return written


if __name__ == "__main__":
    main()
