"""The quickstart: embedded arithmetic task -> tiny model -> SFT warm start -> GRPO, all on CPU.

    bash scripts/quickstart.sh                 # sets up .venv, then runs this file
    .venv/bin/python examples/quickstart/run_quickstart.py [--out quickstart_out] [--rollout auto|vllm|hf] [--fast]

Stages (each is an ordinary command a verl user would type; its log goes to <out>/logs/<stage>.log):
1. data   ``python examples/data_preprocess/arithmetic.py --sft``: RL parquet (verl's schema) + SFT pairs.
2. model  ``python -m verl.utils.embedded.make_model --size tiny``: a ~1M-parameter Qwen2 with a byte tokenizer.
3. sft    ``python -m verl.trainer.fsdp_sft_trainer``: a short warm start that teaches the answer format and
          part of the arithmetic, leaving room for RL.
4. grpo   ``python -m verl.trainer.main_ppo algorithm.adv_estimator=grpo``: n samples per prompt, rule reward,
          greedy validation before training and every ``test_freq`` steps.
5. report a short table (mean training score between validations, greedy validation accuracy at each), the
          first and last step's score, greedy accuracy after SFT (= before GRPO) and after GRPO, and the plot
          <out>/training_curves.png (score, validation accuracy, response length, entropy).

While a stage runs its progress is live: a bar with the latest score on a terminal, otherwise a status line
at least every 5 seconds (stage_progress.py). A stage whose output already exists is reused (delete <out> to
start over). ``--fast`` shrinks everything for a smoke test.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import shutil
import subprocess
import sys
import threading
import time

from verl.utils.plotting import plot_training_curves

from stage_progress import GRPO_PHASES, GRPO_SHOWN, SFT_PHASES, SFT_SHOWN, StageProgress, fmt_duration, stamp

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VAL_PREFIX = "val-core/arithmetic/reward/mean@"  # greedy validation: one sample per (unique) prompt -> mean@1
SCORE_KEY = "critic/score/mean"

# Task and training knobs, tuned so that the tiny model ends SFT in a moderate regime and GRPO has room to improve
# (see docs/quickstart.md for measured numbers).
TASK = dict(train_size=5000, test_size=600, min_digits=1, max_digits=1, operators="+-")
SFT = dict(steps=120, batch=64, lr="3e-3")
GRPO = dict(steps=200, batch=32, mini_batch=32, n=8, lr="5e-4", warmup=10, test_freq=25, response_length=8)
FAST = dict(task=dict(train_size=256, test_size=32), sft=dict(steps=4, batch=16),
            grpo=dict(steps=2, batch=8, mini_batch=4, n=4, test_freq=2))


def log(msg: str) -> None:
    print(stamp(msg), flush=True)


def _pump(stream, lines: queue.Queue) -> None:
    for line in stream:
        lines.put(line)
    lines.put(None)


def run_stage(name: str, cmd: list[str], out: str, env: dict, steps: int | None = None, shown=None,
              phases=None) -> float:
    """Run ``cmd``, writing its output to <out>/logs/<name>.log while showing live progress (stage_progress);
    exit with the log's tail on failure."""
    os.makedirs(os.path.join(out, "logs"), exist_ok=True)
    path = os.path.join(out, "logs", f"{name}.log")
    log(f"{name}: {' '.join(cmd[:4])} ... (log: {path})")
    start = time.time()
    env = dict(env, PYTHONUNBUFFERED="1")  # the stage's lines arrive as they are printed
    with open(path, "w") as f, StageProgress(name, steps, shown, phases) as progress:
        f.write(" ".join(cmd) + "\n\n")
        f.flush()
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                errors="replace", bufsize=1)
        lines: queue.Queue = queue.Queue()
        threading.Thread(target=_pump, args=(proc.stdout, lines), daemon=True).start()
        while True:
            try:
                line = lines.get(timeout=1.0)
            except queue.Empty:
                line = ""
            if line is None:
                break
            if line:
                f.write(line)
                progress.feed(line)
            progress.tick()
        returncode = proc.wait()
    took = time.time() - start
    if returncode != 0:
        with open(path) as f:
            tail = f.read()[-4000:]
        print(tail, file=sys.stderr)
        log(f"{name} FAILED (exit {returncode}) after {took:.0f}s; full log: {path}")
        sys.exit(returncode or 1)
    log(f"{name}: done in {fmt_duration(took)}")
    return took


def dedupe_prompts(path: str) -> int:
    """Keep the first row of each distinct prompt: verl groups validation samples by prompt text, so repeated
    prompts would turn the greedy mean@1 into mean@k. Returns the number of rows kept."""
    import pandas as pd

    df = pd.read_parquet(path)
    key = df["prompt"].map(lambda p: p[0]["content"])
    df = df[~key.duplicated()].reset_index(drop=True)
    df.to_parquet(path)
    return len(df)


def pick_rollout(requested: str) -> str:
    if requested != "auto":
        return requested
    try:
        import vllm  # noqa: F401
    except Exception as e:  # not installed, or a broken install
        log(f"notice: vLLM is not importable ({type(e).__name__}); using the HF rollout (rollout.name=hf) instead")
        return "hf"
    return "vllm"


def read_metrics(path: str) -> list[tuple[int, dict]]:
    rows = []
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line:
                    rec = json.loads(line)
                    rows.append((int(rec["step"]), rec["data"]))
    return rows


def summary_rows(grpo_metrics: list[tuple[int, dict]]) -> list[tuple[str, float | None, float | None]]:
    """Short table rows ``(steps, mean training score over those steps, greedy val accuracy at the end)``: one row
    per validation (step 0 = the SFT model), so ~10 rows however long the run."""
    scores = {s: m[SCORE_KEY] for s, m in grpo_metrics if SCORE_KEY in m}
    vals = {s: v for s, m in grpo_metrics for k, v in m.items() if k.startswith(VAL_PREFIX)}
    last = max(scores, default=0)
    ends = sorted(vals)
    if not ends or ends[-1] < last:  # no validation, or none at the end: cut the rest into ~8 chunks
        first = ends[-1] + 1 if ends else 1
        chunk = max(1, -(-(last - first + 1) // 8))
        ends += list(range(first + chunk - 1, last, chunk)) + [last]
    rows, prev = [], 0
    for end in sorted(set(ends)):
        window = [scores[s] for s in scores if prev < s <= end]
        label = "0 (SFT model)" if end == 0 else (f"{prev + 1}-{end}" if end > prev + 1 else str(end))
        rows.append((label, sum(window) / len(window) if window else None, vals.get(end)))
        prev = end
    return rows


def report(grpo_metrics: list[tuple[int, dict]], plot: str | None, timings: dict) -> dict:
    scores = [(s, m[SCORE_KEY]) for s, m in grpo_metrics if SCORE_KEY in m]
    vals = [(s, v) for s, m in grpo_metrics for k, v in m.items() if k.startswith(VAL_PREFIX)]
    print("\n=== GRPO on the embedded arithmetic task ===")
    print(f"{'steps':>13} | {'mean score':>10} | {'greedy val acc':>14}")
    for label, score, val in summary_rows(grpo_metrics):
        score_s = f"{score:.3f}" if score is not None else ""
        val_s = f"{val:.3f}" if val is not None else ""
        print(f"{label:>13} | {score_s:>10} | {val_s:>14}")
    summary = {}
    if scores:
        summary.update(first_step_score=scores[0][1], last_step_score=scores[-1][1])
        print(f"mean score: first step {scores[0][1]:.3f} -> last step {scores[-1][1]:.3f}")
    if vals:
        summary.update(val_after_sft=vals[0][1], val_after_grpo=vals[-1][1])
        print(f"greedy validation accuracy: after SFT (before GRPO) {vals[0][1]:.3f} -> after GRPO {vals[-1][1]:.3f}")
    print(f"training curves: {plot or '(not written: no metrics)'}")
    print("stage times: " + ", ".join(f"{k} {fmt_duration(v)}" for k, v in timings.items()))
    return summary


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.path.join(REPO, "quickstart_out"))
    parser.add_argument("--rollout", default="auto", choices=["auto", "vllm", "hf"])
    parser.add_argument("--model_size", default="tiny", choices=["tiny", "small"])
    parser.add_argument("--fast", action="store_true", help="tiny sizes and step counts (smoke test)")
    parser.add_argument("--sft_steps", type=int, default=None)
    parser.add_argument("--grpo_steps", type=int, default=None)
    parser.add_argument("--grpo_lr", default=None, help="actor learning rate of the GRPO stage")
    parser.add_argument("--seed", type=int, default=None,
                        help="one seed for the model's initial weights, SFT's data order and GRPO's data order, "
                             "weight init and sampling (default: each stage's own default seed)")
    args = parser.parse_args(argv)

    task, sft, grpo = dict(TASK), dict(SFT), dict(GRPO)
    if args.fast:
        task.update(FAST["task"]), sft.update(FAST["sft"]), grpo.update(FAST["grpo"])
    if args.sft_steps:
        sft["steps"] = args.sft_steps
    if args.grpo_steps:
        grpo["steps"] = args.grpo_steps
    if args.grpo_lr:
        grpo["lr"] = args.grpo_lr
    out = os.path.abspath(args.out)

    def seeded(*templates: str) -> list[str]:
        return [t.format(args.seed) for t in templates] if args.seed is not None else []

    data_dir, model_dir = os.path.join(out, "data"), os.path.join(out, "models", args.model_size)
    sft_dir, grpo_dir = os.path.join(out, "sft"), os.path.join(out, "grpo")
    py = sys.executable
    cores = os.cpu_count() or 1
    env = dict(os.environ)
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", RAY_AUTH_MODE="disabled", TOKENIZERS_PARALLELISM="false",
               PYTHONPATH=REPO + os.pathsep + env.get("PYTHONPATH", ""))
    env.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    env.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    # OMP_WAIT_POLICY is left to the user. PASSIVE (idle OpenMP threads sleep at once) measured 3-4x faster actor
    # updates on 2 cores shared with other busy jobs, but 2.3x slower GRPO steps on an idle machine (every
    # parallel region then pays a wake-up); the OpenMP default (spin briefly, then sleep) is right when idle.
    # Ray starts its workers at nice 15; next to other busy processes they then get a sliver of the CPU (measured
    # 30x slower actor updates on a shared 2-core machine). No effect on an otherwise idle machine.
    env.setdefault("RAY_worker_niceness", "0")
    rollout = pick_rollout(args.rollout)
    log(f"output: {out}; rollout engine: {rollout}; {cores} CPU core(s)")
    t0, timings = time.time(), {}

    # 1. data
    if not os.path.exists(os.path.join(data_dir, "sft", "train.parquet")):
        timings["data"] = run_stage("data", [
            py, "examples/data_preprocess/arithmetic.py", "--local_dir", data_dir, "--sft",
            "--train_size", str(task["train_size"]), "--test_size", str(task["test_size"]),
            "--min_digits", str(task["min_digits"]), "--max_digits", str(task["max_digits"]),
            "--operators", task["operators"],
        ], out, env)
        log(f"validation prompts (distinct): {dedupe_prompts(os.path.join(data_dir, 'test.parquet'))}")
    # 2. model
    if not os.path.exists(os.path.join(model_dir, "config.json")):
        timings["model"] = run_stage("model", [py, "-m", "verl.utils.embedded.make_model", "--size", args.model_size,
                                               "--out", model_dir, *seeded("--seed", "{}")], out, env)
    # 3. SFT warm start
    sft_model = os.path.join(sft_dir, f"global_step_{sft['steps']}", "huggingface")
    if not os.path.exists(os.path.join(sft_model, "config.json")):
        timings["sft"] = run_stage("sft", [
            py, "-m", "verl.trainer.fsdp_sft_trainer",
            f"data.train_files={data_dir}/sft/train.parquet", f"data.val_files={data_dir}/sft/test.parquet",
            "data.prompt_key=prompt", "data.response_key=response", "data.max_length=32",
            f"data.train_batch_size={sft['batch']}", f"data.micro_batch_size_per_gpu={sft['batch']}",
            f"model.partial_pretrain={model_dir}", "model.enable_gradient_checkpointing=false",
            f"optim.lr={sft['lr']}", "optim.lr_warmup_steps_ratio=0.05",
            f"trainer.total_training_steps={sft['steps']}", f"trainer.test_freq={max(sft['steps'] // 4, 1)}",
            "trainer.logger=[console]", f"trainer.default_local_dir={sft_dir}",
            "trainer.project_name=quickstart", "trainer.experiment_name=arith_sft", *seeded("trainer.seed={}"),
        # OMP_NUM_THREADS=1: 128-wide matmuls are as fast on one thread, and robust to a busy machine
        ], out, dict(env, OMP_NUM_THREADS="1"), steps=sft["steps"], shown=SFT_SHOWN, phases=SFT_PHASES)
    log(f"SFT model: {sft_model}")

    # 4. GRPO
    metrics_file = os.path.join(grpo_dir, "metrics.jsonl")
    if os.path.exists(grpo_dir):
        shutil.rmtree(grpo_dir)
    os.makedirs(grpo_dir)
    grpo_env = dict(env, VERL_FILE_LOGGER_PATH=metrics_file)
    timings["grpo"] = run_stage("grpo", [
        py, "-m", "verl.trainer.main_ppo",
        "algorithm.adv_estimator=grpo",
        f"data.train_files={data_dir}/train.parquet", f"data.val_files={data_dir}/test.parquet",
        f"data.train_batch_size={grpo['batch']}", "data.max_prompt_length=32",
        f"data.max_response_length={grpo['response_length']}", "data.dataloader_num_workers=0",
        f"actor_rollout_ref.model.path={sft_model}",
        "actor_rollout_ref.model.enable_gradient_checkpointing=false",
        f"actor_rollout_ref.actor.optim.lr={grpo['lr']}",
        # a fresh Adam's first steps move every weight by ~lr: warm up so they do not knock the SFT model about
        f"actor_rollout_ref.actor.optim.lr_warmup_steps={min(grpo['warmup'], grpo['steps'])}",
        # cosine decay to 0: the policy settles at the end instead of being caught mid-oscillation
        "actor_rollout_ref.actor.optim.lr_scheduler_type=cosine", "actor_rollout_ref.actor.optim.min_lr_ratio=0.0",
        # several optimizer steps per batch of rollouts (batch / mini_batch), as verl's examples do
        f"actor_rollout_ref.actor.ppo_mini_batch_size={grpo['mini_batch']}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={grpo['mini_batch'] * grpo['n']}",
        "actor_rollout_ref.actor.use_kl_loss=false", "actor_rollout_ref.actor.entropy_coeff=0",
        # fp32 compute: the exact path (rollout and trainer log-probs agree, training/rollout_probs_diff_* ~1e-7),
        # and bf16 is emulated -- 10-20x slower -- on CPUs without AVX-512 BF16/AMX (docs/ppo_trainer.md)
        "actor_rollout_ref.actor.fsdp_config.dtype=fp32", "actor_rollout_ref.ref.fsdp_config.dtype=fp32",
        "actor_rollout_ref.rollout.dtype=fp32",
        f"actor_rollout_ref.rollout.name={rollout}", f"actor_rollout_ref.rollout.n={grpo['n']}",
        "actor_rollout_ref.rollout.temperature=1.0", "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={grpo['batch'] * grpo['n']}",
        f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={grpo['batch'] * grpo['n']}",
        "trainer.n_gpus_per_node=1", "trainer.nnodes=1", "trainer.logger=[console,file]",
        "trainer.val_before_train=true", f"trainer.test_freq={grpo['test_freq']}", "trainer.save_freq=-1",
        f"trainer.total_training_steps={grpo['steps']}", "trainer.total_epochs=1000",
        f"trainer.default_local_dir={grpo_dir}/ckpt", "trainer.project_name=quickstart",
        "trainer.experiment_name=arith_grpo",
        *seeded("data.seed={}", "actor_rollout_ref.actor.fsdp_config.seed={}", "+actor_rollout_ref.rollout.seed={}"),
    ], out, grpo_env, steps=grpo["steps"], shown=GRPO_SHOWN, phases=GRPO_PHASES)

    # 5. report
    timings["total"] = time.time() - t0
    history = read_metrics(metrics_file)
    plot = plot_training_curves(history, os.path.join(out, "training_curves.png"),
                                title=f"GRPO on arithmetic ({args.model_size} model, {rollout} rollout)")
    summary = report(history, plot, timings)
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(dict(summary, rollout=rollout, timings=timings), f, indent=1)
    print(f"summary: {os.path.join(out, 'summary.json')}")


if __name__ == "__main__":
    main()
