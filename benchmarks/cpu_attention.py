"""Training forward + backward on CPU: eager attention vs sdpa, by sequence length.

    .venv/bin/python benchmarks/cpu_attention.py [--size small] [--shapes 128x64 64x128 32x256 16x512 8x1024]

Each shape is rows x tokens (full rows, no padding) of the embedded model, fp32, the process's torch threads.
Eager and sdpa alternate, 1 warm-up + ``--reps`` timed forward+backward passes each; the script prints the
median seconds and eager / sdpa (< 1 means eager is faster). The baseline is sdpa, transformers' default.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import torch
from transformers import AutoModelForCausalLM

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from verl.utils.embedded import make_model_dir  # noqa: E402


def fwd_bwd(model, ids) -> float:
    start = time.perf_counter()
    out = model(input_ids=ids, use_cache=False)
    out.logits.float().logsumexp(-1).mean().backward()
    model.zero_grad(set_to_none=True)
    return time.perf_counter() - start


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="small")
    parser.add_argument("--shapes", nargs="+", default=["128x64", "64x128", "32x256", "16x512", "8x1024"])
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args(argv)
    path = make_model_dir(os.path.join(tempfile.gettempdir(), f"verl_attn_{args.size}"), size=args.size, seed=0)
    models = {impl: AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation=impl)
              for impl in ("eager", "sdpa")}
    print(f"# {args.size} model, fp32, torch threads {torch.get_num_threads()}, load avg {os.getloadavg()[0]:.1f}")
    print(f"{'rows x tokens':>14} {'eager s':>8} {'sdpa s':>8} {'eager/sdpa':>11}")
    for shape in args.shapes:
        rows, tokens = map(int, shape.split("x"))
        ids = torch.randint(10, 200, (rows, tokens), generator=torch.Generator().manual_seed(0))
        times = {impl: [] for impl in models}
        for rep in range(args.reps + 1):
            for impl, model in models.items():
                seconds = fwd_bwd(model, ids)
                if rep:
                    times[impl].append(seconds)
        eager, sdpa = statistics.median(times["eager"]), statistics.median(times["sdpa"])
        print(f"{shape:>14} {eager:8.3f} {sdpa:8.3f} {eager / sdpa:11.2f}", flush=True)


if __name__ == "__main__":
    main()
