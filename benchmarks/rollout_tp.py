"""Rollout tensor parallel 1 vs 2: the weight push and generation, inside a running GRPO job.

    .venv/bin/python benchmarks/rollout_tp.py [--size small] [--steps 5] [--repeats 3] [--dtype auto]

Same GRPO work as ``grpo_vs_trl.py`` (verl's command line, 32 prompts x 4 samples, completions forced to
``--tokens`` tokens, FSDP over 2 worker processes, vLLM rollout), run with ``rollout.tensor_model_parallel_size=1``
(two engines of one process each, the baseline) and ``=2`` (one engine spanning both processes), alternating
TP=1, TP=2, TP=1, ... ``--repeats`` times each. Per run, the median over steps 2..N of:

- ``timing_s/update_weights``: the push (bucketed FSDP gather + engine load);
- ``perf/weight_push_bytes`` / ``perf/weight_push_recv_bytes``: bytes the engine loaded / bytes the rank received
  (max over ranks);
- ``perf/weight_push_peak_mem_gb``: peak resident memory of a worker process during the push (max over ranks);
- generation throughput: response tokens of the step / ``timing_s/generate_sequences``.

Prints the median and range over runs for each layout and the TP=2 / TP=1 ratio of each. ``--dtype auto`` picks
bf16 on a CPU with native bf16 (AVX-512 BF16 / AMX), fp32 otherwise. No target: on a 2-core machine the two
engines of TP=1 and the one engine of TP=2 share the same cores; this reports what the layouts cost here.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_utils import host_dtype, median_range  # noqa: E402
from grpo_vs_trl import PROMPTS_PER_STEP, SAMPLES, prepare, run_ours  # noqa: E402
KEYS = ("timing_s/update_weights", "perf/weight_push_bytes", "perf/weight_push_recv_bytes",
        "perf/weight_push_peak_mem_gb", "tokens_per_s")


def step_metrics(out: Path) -> list[dict]:
    steps: dict = {}
    for line in (out / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        if "data" in record:
            steps.setdefault(record["step"], {}).update(record["data"])
    ordered = [steps[s] for s in sorted(steps)]
    for m in ordered:
        tokens = m["response_length/mean"] * PROMPTS_PER_STEP * SAMPLES
        m["tokens_per_s"] = tokens / m["timing_s/generate_sequences"]
    return ordered


def one_run(assets: dict, tp: int, args, out: Path) -> dict:
    run_ours(assets, args.tokens, args.dtype, args.steps, 1e-5, 2, out,
             extra=(f"actor_rollout_ref.rollout.tensor_model_parallel_size={tp}",))
    ordered = step_metrics(out)[1:]  # step 1 includes first-call warm-up
    return {key: statistics.median(m[key] for m in ordered) for key in KEYS}


def summary(runs: list[dict], key: str) -> tuple[float, float, float]:
    return median_range(r[key] for r in runs)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="small")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtype", default="auto", choices=("auto", "fp32", "bf16"))
    args = parser.parse_args(argv)
    args.dtype = host_dtype(args.dtype)
    root = Path(tempfile.mkdtemp(prefix="rollout_tp_"))
    assets = prepare(root, args.size, args.steps)
    runs: dict[int, list[dict]] = {1: [], 2: []}
    for i in range(args.repeats):
        for tp in (1, 2):
            result = one_run(assets, tp, args, root / f"tp{tp}-{i}")
            runs[tp].append(result)
            print(f"run {i} TP={tp}: " + ", ".join(f"{k}={v:.4g}" for k, v in result.items()), flush=True)
    print(f"\n{args.size} model, {args.dtype}, 2 worker processes, {PROMPTS_PER_STEP} prompts x {SAMPLES} samples x "
          f"{args.tokens} tokens, median over steps 2..{args.steps} per run, then median [min, max] over "
          f"{args.repeats} runs per layout (alternating)")
    print(f"{'metric':32s} {'rollout TP=1 (baseline)':>30s} {'rollout TP=2':>30s} {'TP2/TP1':>8s}")
    for key in KEYS:
        one, two = summary(runs[1], key), summary(runs[2], key)
        cell = lambda s: f"{s[0]:.4g} [{s[1]:.4g}, {s[2]:.4g}]"  # noqa: E731
        print(f"{key:32s} {cell(one):>30s} {cell(two):>30s} {two[0] / one[0] if one[0] else float('nan'):8.2f}")


if __name__ == "__main__":
    main()
