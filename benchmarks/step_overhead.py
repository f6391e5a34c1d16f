"""Per-step overhead of a GRPO step: the time that is not the engines' own compute.

    .venv/bin/python benchmarks/step_overhead.py [--size tiny] [--steps 12] [--rollout vllm]

Runs the same GRPO work as ``grpo_vs_trl.py`` (verl's command line, no tuning keys, 32 prompts x 4 samples,
fixed-length completions, fp32) and splits the mean step (steps 2..N) into

- compute, measured inside the workers: generation in the engine (``timing_s/generate_sequences``), the
  hybrid-engine weight push (``timing_s/update_weights``), the actor update (``perf/update_actor_s``: forward,
  backward, optimizer step) and, when they run, the critic update and the trainer's log-prob pass;
- overhead = step - compute: Ray dispatch and collect, DataProto (de)serialisation and padding, the reward
  function with its tokenizer decode, advantages, metrics and logging -- per timed section, the driver-side
  time minus the in-worker time, and the driver's untimed work between sections.

Target: overhead <= 50 ms per step on the tiny config. The baseline named in the ratio is the step itself
(overhead / step).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from grpo_vs_trl import CONFIGS, DRIVER_SECTIONS, prepare, run_ours  # noqa: E402

# driver-side section -> the seconds of it spent inside the workers
INSIDE = {"gen": ("generate_sequences",), "update_actor": ("perf/update_actor_s",),
          "update_critic": ("perf/update_critic_s",)}


def split(step_s: float, timing: dict) -> tuple[dict, float, float]:
    """(overhead per part, compute seconds, overhead seconds) of one median step. The weight push counts as
    overhead: it moves weights, it computes nothing."""
    sections = {k: v for k, v in timing.items() if k in DRIVER_SECTIONS}
    inside = {k: sum(timing.get(part, 0.0) for part in parts) for k, parts in INSIDE.items()}
    compute = sum(inside[k] for k in sections if k in inside)
    overhead = {f"{k} (driver + Ray)" if k in inside else k: v - inside.get(k, 0.0) for k, v in sections.items()}
    if "gen" in sections:  # of the rollout call's non-generation time, the weight push
        overhead["gen (driver + Ray)"] -= timing.get("update_weights", 0.0)
        overhead["weight push"] = timing.get("update_weights", 0.0)
    overhead["untimed driver work"] = step_s - sum(sections.values())
    return overhead, compute, step_s - compute


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="tiny", choices=sorted(CONFIGS))
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--rollout", default="vllm", choices=["vllm", "hf"])
    parser.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "verl_step_overhead"))
    parser.add_argument("--ours_extra", nargs="*", default=[], help="extra key=value overrides")
    args = parser.parse_args(argv)

    spec = CONFIGS[args.size]
    work = Path(args.workdir)
    assets = prepare(work, spec["size"], args.steps)
    res = run_ours(assets, spec["tokens"], "fp32", args.steps, 1e-4, 1, work / f"{args.size}-{args.rollout}",
                   args.rollout, tuple(args.ours_extra))
    step_s = statistics.mean(res["step_s"][1:])  # means: the parts then add up to the step
    overhead, compute, total = split(step_s, res["breakdown"])
    print(f"# {args.size} ({spec['tokens']}-token completions, {args.rollout}): steps "
          f"{[round(s, 3) for s in res['step_s']]} s, load avg {os.getloadavg()[0]:.1f}")
    print(f"step {step_s * 1000:.0f} ms = compute {compute * 1000:.0f} ms (in the workers) + overhead "
          f"{total * 1000:.0f} ms ({total / step_s:.0%} of the step; target <= 50 ms)")
    for name, seconds in sorted(overhead.items(), key=lambda kv: -kv[1]):
        print(f"  overhead: {name:24} {seconds * 1000:7.1f} ms")
    print("  compute: " + ", ".join(f"{k} {res['breakdown'].get(p, 0.0) * 1000:.0f} ms" for k, parts in INSIDE.items()
                                    for p in parts if p in res["breakdown"]))
    return {"step_s": step_s, "compute_s": compute, "overhead_s": total, "overhead": overhead}


if __name__ == "__main__":
    main()
