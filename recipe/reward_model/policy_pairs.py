"""Preference pairs from the policy's own samples, labelled by a rule.

``python -m recipe.reward_model.policy_pairs --samples gen.parquet --out pairs.parquet`` reads the output of
``python -m verl.trainer.main_generation`` (the prompt rows plus a ``responses`` list per row), scores every
response with the rule of its ``data_source`` (verl's ``default_compute_score``, the scorer PPO's rule reward
uses), and writes reward-model training rows ``prompt, chosen, rejected`` where ``chosen`` is a response the rule
accepts and ``rejected`` one it does not, both for the same prompt. A reward model trained on these ranks what the
policy actually writes, which is what it has to rank during PPO.

Options: ``--pairs_per_prompt`` caps the pairs of one prompt (distinct correct x distinct wrong responses, drawn
with ``--seed``); ``--reference_when_none_correct`` uses the row's ground truth as the chosen response for a
prompt none of whose samples is right (otherwise such a prompt gives no pairs). Empty responses are skipped (a
pair needs two non-empty responses). The counts are printed.
"""

from __future__ import annotations

import argparse
import random
from collections import Counter

import pandas as pd

from verl.utils.reward_score import default_compute_score

__all__ = ["build_pairs"]

PASS = 1.0


def _correct(row, response: str) -> bool:
    score = default_compute_score(row["data_source"], response, row["reward_model"]["ground_truth"],
                                  extra_info=row.get("extra_info"))
    if isinstance(score, dict):
        score = score["score"]
    return float(score) >= PASS


def build_pairs(samples: pd.DataFrame, pairs_per_prompt: int = 16, reference_when_none_correct: bool = False,
                seed: int = 0) -> tuple[pd.DataFrame, Counter]:
    """Rows ``prompt, chosen, rejected`` (+ the sample rows' other columns) and counts of what was seen."""
    if "responses" not in samples.columns:
        raise ValueError("the samples file has no 'responses' column: pass the output of "
                         "python -m verl.trainer.main_generation (data.output_path)")
    rng = random.Random(seed)
    keep = [c for c in samples.columns if c != "responses"]
    rows, counts = [], Counter()
    for _, row in samples.iterrows():
        responses = [str(r) for r in row["responses"]]
        counts["samples"] += len(responses)
        counts["empty"] += sum(not r.strip() for r in responses)
        responses = [r for r in responses if r.strip()]
        right = sorted({r for r in responses if _correct(row, r)})
        wrong = sorted({r for r in responses if r not in right})
        counts["correct"] += sum(r in right for r in responses)
        if not right and reference_when_none_correct:
            right = [str(row["reward_model"]["ground_truth"])]
            counts["prompts_with_reference_chosen"] += 1
        if not right or not wrong:
            counts["prompts_without_pairs"] += 1
            continue
        combos = [(c, r) for c in right for r in wrong]
        rng.shuffle(combos)
        for chosen, rejected in combos[:pairs_per_prompt]:
            out = {k: row[k] for k in keep}
            out["chosen"], out["rejected"] = chosen, rejected
            rows.append(out)
    counts["pairs"] = len(rows)
    return pd.DataFrame(rows), counts


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--samples", required=True, help="main_generation output (prompt rows + 'responses')")
    p.add_argument("--out", required=True, help="parquet to write (prompt, chosen, rejected, ...)")
    p.add_argument("--pairs_per_prompt", type=int, default=16)
    p.add_argument("--reference_when_none_correct", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    pairs, counts = build_pairs(pd.read_parquet(args.samples), args.pairs_per_prompt,
                                args.reference_when_none_correct, args.seed)
    if pairs.empty:
        raise SystemExit(f"no pairs: every prompt's samples were all right or all wrong ({dict(counts)}); "
                         "sample more per prompt (data.n_samples) or pass --reference_when_none_correct")
    pairs.to_parquet(args.out)
    print(f"wrote {args.out}: {dict(counts)}")


if __name__ == "__main__":
    main()
