"""GRPO step time: ours (`python -m verl.trainer.main_ppo`, vLLM rollout) vs TRL's GRPOTrainer, identical work.

    .venv/bin/python benchmarks/grpo_vs_trl.py --configs tiny small --dtypes fp32 bf16 --steps 6

Identical work per step, both sides: the same model weights (``make_model_dir``), the same 32 arithmetic prompts
x 4 samples (temperature 1, no top-k/top-p), every completion forced to the same length (``tiny``: 4 tokens,
``small``: 32 tokens; ours ``rollout.ignore_eos=True``, TRL ``min_new_tokens``), the same reward function
(share of digits in the completion), one optimizer step per 128 completions (AdamW, same lr, weight decay 0.01,
grad clip 1.0), no KL term (ours: no reference model; TRL ``beta=0``).
Our side runs the command line a verl user writes for this work -- no tuning keys besides gradient checkpointing
(set on both sides, below): compute dtype and the old-log-prob source are left to the host-aware defaults, which
print what they chose
(on CPU with one mini-batch per step: the update's own forward gives the old log-probs, as TRL's
``num_iterations=1`` does). ``--old_log_prob trainer`` forces verl's separate log-prob pass,
``--old_log_prob bypass`` the rollout engine's log-probs (``algorithm.rollout_correction.bypass_mode=True``).
Each side runs in one process with both cores (ours: ``trainer.n_gpus_per_node=1``).

Fairness settings (both sides, stated here and printed with the results):
- the same arithmetic: gradient checkpointing set explicitly on both sides (``--grad_ckpt``, default off -- what
  our host-aware defaults pick for these models on CPU; TRL's own default is on), the same compute dtype, the
  same schedule;
- the same timer: the training loop's period, step end to step end, on both sides -- TRL's ``on_step_end``
  callback; ours, the moment each step's metrics line lands in the file logger. Both periods therefore include
  data preparation (prompt tokenisation), generation, training and logging. Our driver's ``timing_s/step``
  (the step alone) is printed beside it;
- ``--repeats`` (default 3) runs per side, alternating ours / TRL; each run's median over steps 2..N (start-up --
  imports, Ray, engine init -- excluded on both sides), then the median and [min, max] over runs, and
  TRL / ours (> 1 means ours is faster). Targets (fp32): ``small`` >= 1.3x TRL, ``tiny`` >= 1.0x.

TRL runs in its own virtualenv (default /tmp/trl-venv), created on first use with
``pip install torch==2.13.0 "trl==1.16.*"`` (the torch pin keeps pip on the local CPU wheel; an unpinned torch
would pull a multi-GB CUDA build). ``--skip_trl`` / ``--skip_ours`` run one side only.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_utils import StepEndWatcher, median_range  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
CONFIGS = {"tiny": dict(size="tiny", tokens=4), "small": dict(size="small", tokens=32)}
PROMPTS_PER_STEP, SAMPLES = 32, 4
# the driver's timed sections of a step (timing_s/<name>); the other timing_s/ keys are measured in the workers
DRIVER_SECTIONS = ("gen", "gen_max", "old_log_prob", "ref", "values", "reward", "adv", "update_critic",
                   "update_actor", "testing", "save_checkpoint")
OLD_LOG_PROB_KEYS = {"auto": [], "trainer": ["actor_rollout_ref.actor.old_log_prob_source=trainer"],
                     "bypass": ["algorithm.rollout_correction.bypass_mode=True"]}

REWARD_PY = textwrap.dedent('''
    def compute_score(data_source, solution_str, ground_truth, extra_info=None):
        return sum(ch.isdigit() for ch in solution_str) / max(1, len(solution_str))
''')

TRL_SCRIPT = textwrap.dedent('''
    import json, statistics, sys, time
    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    model_dir, data_path, steps, tokens, dtype, lr, out_dir, out_json, rows_per_step, samples, ckpt = sys.argv[1:12]
    steps, tokens, lr, rows_per_step, samples = int(steps), int(tokens), float(lr), int(rows_per_step), int(samples)
    torch.manual_seed(0)
    rows = Dataset.from_parquet(data_path).to_list()
    ds = Dataset.from_list([{"prompt": r["prompt"]} for r in rows])

    def digits(completions, **kwargs):
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [sum(ch.isdigit() for ch in t) / max(1, len(t)) for t in texts]

    class StepTimes(TrainerCallback):
        def __init__(self):
            self.ends = []
        def on_train_begin(self, args, state, control, **kw):
            self.start = time.perf_counter()
        def on_step_end(self, args, state, control, **kw):
            self.ends.append(time.perf_counter())

    bf16 = dtype == "bf16"
    cfg = GRPOConfig(output_dir=out_dir, per_device_train_batch_size=rows_per_step, gradient_accumulation_steps=1,
                     num_generations=samples, max_completion_length=tokens, generation_kwargs={"min_new_tokens": tokens},
                     temperature=1.0, top_p=1.0, top_k=0, learning_rate=lr, lr_scheduler_type="constant",
                     warmup_steps=0, weight_decay=0.01, max_grad_norm=1.0, beta=0.0, num_iterations=1,
                     max_steps=steps, logging_steps=1, save_strategy="no", report_to=[], use_cpu=True, bf16=bf16,
                     model_init_kwargs={"dtype": torch.bfloat16 if bf16 else torch.float32},
                     shuffle_dataset=False, dataloader_num_workers=0, seed=0, disable_tqdm=True,
                     gradient_checkpointing=ckpt == "on")
    tok = AutoTokenizer.from_pretrained(model_dir)
    timer = StepTimes()
    trainer = GRPOTrainer(model=model_dir, reward_funcs=[digits], args=cfg, train_dataset=ds,
                          processing_class=tok, callbacks=[timer])
    trainer.train()
    times = [b - a for a, b in zip([timer.start] + timer.ends[:-1], timer.ends)]
    lengths = [h.get("completions/mean_length") for h in trainer.state.log_history if "completions/mean_length" in h]
    json.dump({"step_s": times, "mean_completion_length": lengths, "torch": torch.__version__,
               "threads": torch.get_num_threads()}, open(out_json, "w"))
''')


def ensure_trl_venv(venv: Path) -> Path:
    python = venv / "bin" / "python"
    if not python.exists():
        print(f"# creating {venv} with TRL (one-time, a few minutes)", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "torch==2.13.0", "trl==1.16.*"], check=True)
    probe = subprocess.run([str(python), "-c", "import torch, trl; print(torch.__version__, trl.__version__)"],
                           capture_output=True, text=True, check=True).stdout.split()
    if "+cpu" not in probe[0]:
        raise SystemExit(f"{venv} has torch {probe[0]}, not the CPU build; remove the venv and rerun")
    return python


def prepare(root: Path, size: str, steps: int) -> dict:
    import pandas as pd

    sys.path.insert(0, str(REPO))
    from verl.utils.embedded import make_model_dir
    from verl.utils.embedded.arithmetic import make_rl_rows

    root.mkdir(parents=True, exist_ok=True)
    data = root / "train.parquet"
    if not data.exists():
        pd.DataFrame(make_rl_rows(PROMPTS_PER_STEP * steps, "train", seed=0)).to_parquet(data)
    (root / "reward.py").write_text(REWARD_PY)
    return {"model": make_model_dir(str(root / f"model-{size}"), size=size, seed=0), "data": data,
            "reward": root / "reward.py"}


def run_trl(python: Path, assets: dict, tokens: int, dtype: str, steps: int, lr: float, out: Path,
            prompts: int = PROMPTS_PER_STEP, samples: int = SAMPLES, grad_ckpt: str = "off") -> dict:
    out.mkdir(parents=True, exist_ok=True)
    script = out / "trl_grpo.py"
    script.write_text(TRL_SCRIPT)
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", PYTHONPATH="")
    with open(out / "log.txt", "w") as log:
        proc = subprocess.run([str(python), str(script), assets["model"], str(assets["data"]), str(steps), str(tokens),
                               dtype, str(lr), str(out / "trl_out"), str(out / "result.json"), str(prompts * samples),
                               str(samples), grad_ckpt], env=env, stdout=log,
                              stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        raise SystemExit(f"TRL run failed, see {out / 'log.txt'}")
    result = json.loads((out / "result.json").read_text())
    return {"step_s": result["step_s"], "length": result["mean_completion_length"]}


def run_ours(assets: dict, tokens: int, dtype: str, steps: int, lr: float, workers: int, out: Path,
             rollout: str = "vllm", extra: tuple = (), old_log_prob: str = "auto", prompts: int = PROMPTS_PER_STEP,
             samples: int = SAMPLES, max_prompt_length: int = 48, grad_ckpt: str = "off") -> dict:
    out.mkdir(parents=True, exist_ok=True)
    rows = prompts * samples
    args = [
        "algorithm.adv_estimator=grpo",
        f"data.train_files={assets['data']}",
        f"data.val_files={assets['data']}",
        f"data.train_batch_size={prompts}",
        f"data.max_prompt_length={max_prompt_length}",
        f"data.max_response_length={tokens}",
        "data.shuffle=False",
        f"actor_rollout_ref.model.path={assets['model']}",
        f"actor_rollout_ref.model.enable_gradient_checkpointing={grad_ckpt == 'on'}",
        f"actor_rollout_ref.actor.optim.lr={lr}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={prompts}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={rows // workers}",
        "actor_rollout_ref.actor.use_kl_loss=False",
        "actor_rollout_ref.actor.entropy_coeff=0",
        f"actor_rollout_ref.actor.fsdp_config.dtype={'bfloat16' if dtype == 'bf16' else 'fp32'}",
        f"actor_rollout_ref.rollout.name={rollout}",
        f"actor_rollout_ref.rollout.dtype={'bfloat16' if dtype == 'bf16' else 'float32'}",
        f"actor_rollout_ref.rollout.n={samples}",
        "actor_rollout_ref.rollout.ignore_eos=True",
        "actor_rollout_ref.rollout.temperature=1.0",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={rows // workers}",
        "algorithm.use_kl_in_reward=False",
        f"custom_reward_function.path={assets['reward']}",
        "trainer.logger=[console,file]",
        "trainer.val_before_train=False",
        f"trainer.n_gpus_per_node={workers}",
        "trainer.nnodes=1",
        "trainer.save_freq=-1",
        "trainer.test_freq=-1",
        f"trainer.total_training_steps={steps}",
        *OLD_LOG_PROB_KEYS[old_log_prob],
        *extra,
    ]
    metrics_path = out / "metrics.jsonl"
    metrics_path.unlink(missing_ok=True)
    env = dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1", RAY_AUTH_MODE="disabled",
               TOKENIZERS_PARALLELISM="false", VERL_FILE_LOGGER_PATH=str(metrics_path))
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    with open(out / "log.txt", "w") as log, StepEndWatcher(metrics_path) as watcher:
        proc = subprocess.run([sys.executable, "-m", "verl.trainer.main_ppo", *args], cwd=out, env=env, stdout=log,
                              stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        raise SystemExit(f"our run failed, see {out / 'log.txt'}")
    steps_data = {}
    for line in metrics_path.read_text().splitlines():
        record = json.loads(line)
        if "data" in record:
            steps_data.setdefault(record["step"], {}).update(record["data"])
    ordered = [steps_data[s] for s in sorted(steps_data)]
    sections = sorted({k for m in ordered for k in m
                       if (k.startswith("timing_s/") and k != "timing_s/step") or k.startswith("perf/") and k.endswith("_s")})
    return {"step_s": [float("nan")] + watcher.intervals(), "driver_step_s": [m["timing_s/step"] for m in ordered],
            "length": [m["response_length/mean"] for m in ordered],
            "breakdown": {k.removeprefix("timing_s/"): mean_after_first([m.get(k, 0.0) for m in ordered])
                          for k in sections}}


def breakdown_line(step_s: float, breakdown: dict) -> str:
    """The step's timed sections (median over steps 2..N) and what is left: driver work between them."""
    top = {k: v for k, v in breakdown.items() if k in DRIVER_SECTIONS}
    other = step_s - sum(top.values())
    parts = [f"{k} {v:.3f}" for k, v in sorted(top.items(), key=lambda kv: -kv[1]) if v >= 0.0005]
    return " | ".join(parts + [f"untimed {other:.3f}"]) + " (s/step)"


def mean_after_first(values):
    tail = values[1:] if len(values) > 1 else values
    return statistics.mean(tail)


def median_after_first(values):
    tail = values[1:] if len(values) > 1 else values
    return statistics.median(tail)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", nargs="+", default=["tiny", "small"], choices=sorted(CONFIGS))
    parser.add_argument("--dtypes", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=3, help="runs per side, alternating ours / TRL")
    parser.add_argument("--grad_ckpt", default="off", choices=["off", "on"],
                        help="gradient checkpointing, set explicitly on both sides")
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--workers", type=int, default=1, help="our worker processes (trainer.n_gpus_per_node)")
    parser.add_argument("--trl_venv", default=os.path.join(tempfile.gettempdir(), "trl-venv"))
    parser.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "verl_grpo_vs_trl"))
    parser.add_argument("--skip_trl", action="store_true")
    parser.add_argument("--skip_ours", action="store_true")
    parser.add_argument("--rollout", default="vllm", choices=["vllm", "hf"], help="our rollout engine")
    parser.add_argument("--old_log_prob", default="auto", choices=sorted(OLD_LOG_PROB_KEYS),
                        help="ours: auto = no key (host-aware defaults choose), trainer = verl's separate log-prob "
                             "pass, bypass = the rollout engine's log-probs")
    parser.add_argument("--ours_extra", nargs="*", default=[], help="extra key=value overrides for our run")
    args = parser.parse_args(argv)

    work = Path(args.workdir)
    trl_python = None if args.skip_trl else ensure_trl_venv(Path(args.trl_venv))
    print(f"# fairness: gradient checkpointing {args.grad_ckpt} on both sides; timer = step end to step end on both "
          f"sides (includes data preparation and logging); {args.repeats} alternating runs per side", flush=True)
    results = []
    for name in args.configs:
        spec = CONFIGS[name]
        assets = prepare(work, spec["size"], args.steps)
        for dtype in args.dtypes:
            row = {"config": name, "dtype": dtype, "tokens": spec["tokens"], "ours": [], "trl": [], "driver": []}
            sides = ([] if args.skip_ours else ["ours"]) + ([] if args.skip_trl else ["trl"])
            for rep in range(args.repeats):
                for side in sides:
                    load = os.getloadavg()[0]
                    out = work / f"{name}-{dtype}-{side}-{rep}"
                    if side == "ours":
                        res = run_ours(assets, spec["tokens"], dtype, args.steps, args.lr, args.workers, out,
                                       args.rollout, tuple(args.ours_extra), args.old_log_prob,
                                       grad_ckpt=args.grad_ckpt)
                        row["driver"].append(median_after_first(res["driver_step_s"]))
                    else:
                        res = run_trl(trl_python, assets, spec["tokens"], dtype, args.steps, args.lr, out,
                                      grad_ckpt=args.grad_ckpt)
                    row[side].append(median_after_first(res["step_s"]))
                    print(f"# {name} {dtype} {side} run {rep}: steps {[round(x, 3) for x in res['step_s']]} s, "
                          f"completion lengths {res['length']}, load avg at start {load:.1f}", flush=True)
                    if side == "ours":
                        print(f"# {name} {dtype} ours breakdown: {breakdown_line(row['driver'][-1], res['breakdown'])}",
                              flush=True)
            results.append(row)

    def cell(values):
        if not values:
            return "-"
        mid, lo, hi = median_range(values)
        return f"{mid:.3f} [{lo:.3f}, {hi:.3f}]"

    print(f"\n{'config':7} {'dtype':5} {'tokens':>6} {'ours s/step':>24} {'TRL s/step':>24} {'TRL/ours':>9} "
          f"{'ours timing_s/step':>24}")
    for r in results:
        ours, trl = r["ours"], r["trl"]
        ratio = f"{statistics.median(trl) / statistics.median(ours):9.2f}" if ours and trl else "-".rjust(9)
        print(f"{r['config']:7} {r['dtype']:5} {r['tokens']:6d} {cell(ours):>24} {cell(trl):>24} {ratio} "
              f"{cell(r['driver']):>24}")
    return results


if __name__ == "__main__":
    main()
