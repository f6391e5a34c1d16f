"""Greedy accuracy of a model directory on RL-schema parquet prompts (the quickstart's sanity check).

    python examples/quickstart/eval_greedy.py --model DIR --data test.parquet [--n 200] [--max_new_tokens 8]

Each prompt is rendered with the chat template (generation prompt on), decoded greedily with HF ``generate``
and scored with the data source's rule scorer (``verl.utils.reward_score.default_compute_score``). Prints
``greedy_accuracy=<mean score> n=<rows>`` and a few samples; ``--json`` writes the numbers to a file.
"""

from __future__ import annotations

import argparse
import json
import os

import pandas as pd
import torch


def greedy_accuracy(model_dir: str, data_file: str, n: int = 200, max_new_tokens: int = 8, batch_size: int = 64,
                    show: int = 3) -> dict:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from verl.utils.reward_score import default_compute_score

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    rows = pd.read_parquet(data_file).head(n).to_dict("records")
    scores, samples = [], []
    for start in range(0, len(rows), batch_size):
        chunk = rows[start:start + batch_size]
        texts = [tokenizer.apply_chat_template(list(r["prompt"]), add_generation_prompt=True, tokenize=False) for r in chunk]
        enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.no_grad():
            out = model.generate(**enc, do_sample=False, max_new_tokens=max_new_tokens,
                                 eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
        for row, ids in zip(chunk, out[:, enc["input_ids"].shape[1]:]):
            response = tokenizer.decode(ids, skip_special_tokens=False)
            truth = row["reward_model"]["ground_truth"]
            score = float(default_compute_score(row["data_source"], response, truth))
            scores.append(score)
            if len(samples) < show:
                samples.append((row["prompt"][0]["content"], response.replace(tokenizer.pad_token, ""), truth, score))
    return {"greedy_accuracy": sum(scores) / max(len(scores), 1), "n": len(scores), "samples": samples}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--data", required=True)
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--max_new_tokens", type=int, default=8)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    for path, what in ((args.model, "--model"), (args.data, "--data")):
        if not os.path.exists(path):
            raise SystemExit(f"{what} {path} does not exist")
    result = greedy_accuracy(args.model, args.data, args.n, args.max_new_tokens)
    for prompt, response, truth, score in result["samples"]:
        print(f"  {prompt!r} -> {response!r} (truth {truth}, score {score})")
    print(f"greedy_accuracy={result['greedy_accuracy']:.3f} n={result['n']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({k: result[k] for k in ("greedy_accuracy", "n")}, f)


if __name__ == "__main__":
    main()
