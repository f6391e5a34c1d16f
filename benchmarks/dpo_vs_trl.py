"""Offline DPO step time: ours (`python -m recipe.dpo.main_dpo`) vs TRL's DPOTrainer, identical work.

    .venv/bin/python benchmarks/dpo_vs_trl.py --sizes tiny small --steps 10

Identical work per step, both sides: the same model weights (``make_model_dir``, fp32), the same preference
pairs (``verl.utils.embedded.preferences``, two-digit ``+``/``-`` problems, chosen = the answer, rejected = a
wrong one), the same tokens (TRL gets the chat-rendered prompt as a string and adds eos to the answers, which is
exactly our tokenization), 32 pairs per optimizer step in one forward/backward (ours
``dpo.micro_batch_size_per_gpu=32``, TRL ``per_device_train_batch_size=32``, no gradient accumulation), the
sigmoid DPO loss with beta 0.1, AdamW with the same lr, betas, weight decay 0.01, grad clip 1.0, constant lr, no
warm-up. Reference log-probs: computed every step on both sides (TRL's default
``precompute_ref_log_probs=False``, ours ``dpo.precompute_ref_log_probs=false``), or precomputed on both sides
with ``--precompute``. Everything else is each side's default: ours runs each pair as one packed
``[prompt | chosen | rejected]`` sequence (``dpo.share_prompt_prefix=true``; ``--no_share_prompt`` measures two
rows per pair, TRL's layout). Each side runs in one process with both cores
(ours: one worker, ``trainer.n_gpus_per_node=1``).

Fairness settings (both sides): gradient checkpointing set explicitly on both (``--grad_ckpt``, default off --
what our host-aware defaults pick for these models on CPU; TRL's own default is on); the same timer -- the
training loop's period, step end to step end (TRL's ``on_step_end`` callback; ours, the moment each step's
metrics line lands in the file logger), so both include batch collation and logging; ``--repeats`` (default 3)
runs per side, alternating ours / TRL. Reported: each run's median over steps 2..N (start-up -- imports, Ray,
model load, dataset tokenization, precomputation -- excluded on both sides), then the median and [min, max] over
runs, pairs per second and ours / TRL throughput (> 1 means ours is faster). Goal: >= 1.5x. Our driver's
``timing_s/step`` (the step alone) is printed beside it.

TRL runs in its own virtualenv (default /tmp/trl-venv, created on first use like ``grpo_vs_trl.py`` does).
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
from grpo_vs_trl import REPO, ensure_trl_venv, median_after_first  # noqa: E402

PAIRS_PER_STEP = 32
BETA = 0.1

TRL_SCRIPT = textwrap.dedent('''
    import json, sys, time
    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import DPOConfig, DPOTrainer

    model_dir, data_path, steps, batch, beta, lr, precompute, out_dir, out_json, ckpt = sys.argv[1:11]
    steps, batch, beta, lr, precompute = int(steps), int(batch), float(beta), float(lr), precompute == "1"
    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(model_dir)
    rows = Dataset.from_parquet(data_path).to_list()
    # the prompt exactly as the other side renders it; string answers get eos appended by TRL
    ds = Dataset.from_list([{"prompt": tok.apply_chat_template(list(r["prompt"]), add_generation_prompt=True,
                                                               tokenize=False),
                             "chosen": r["chosen"], "rejected": r["rejected"]} for r in rows])

    class StepTimes(TrainerCallback):
        def __init__(self):
            self.ends = []
        def on_train_begin(self, args, state, control, **kw):
            self.start = time.perf_counter()
        def on_step_end(self, args, state, control, **kw):
            self.ends.append(time.perf_counter())

    cfg = DPOConfig(output_dir=out_dir, per_device_train_batch_size=batch, gradient_accumulation_steps=1,
                    beta=beta, loss_type=["sigmoid"], learning_rate=lr, lr_scheduler_type="constant", warmup_steps=0,
                    weight_decay=0.01, adam_beta1=0.9, adam_beta2=0.999, max_grad_norm=1.0,
                    precompute_ref_log_probs=precompute, max_steps=steps, logging_steps=1, save_strategy="no",
                    report_to=[], use_cpu=True, bf16=False, model_init_kwargs={"dtype": torch.float32},
                    dataloader_num_workers=0, seed=0, disable_tqdm=True, gradient_checkpointing=ckpt == "on")
    timer = StepTimes()
    trainer = DPOTrainer(model=model_dir, args=cfg, train_dataset=ds, processing_class=tok, callbacks=[timer])
    sample = trainer.train_dataset[0]
    trainer.train()
    times = [b - a for a, b in zip([timer.start] + timer.ends[:-1], timer.ends)]
    acc = [h["rewards/accuracies"] for h in trainer.state.log_history if "rewards/accuracies" in h]
    json.dump({"step_s": times, "accuracies": acc, "torch": torch.__version__, "threads": torch.get_num_threads(),
               "tokens": [len(sample["prompt_ids"]), len(sample["chosen_ids"]), len(sample["rejected_ids"])]},
              open(out_json, "w"))
''')


def prepare(root: Path, size: str, steps: int) -> dict:
    from verl.utils.embedded import make_model_dir
    from verl.utils.embedded.arithmetic import ArithmeticConfig
    from verl.utils.embedded.preferences import write_preference_files

    data = write_preference_files(str(root / "data"), n_train=PAIRS_PER_STEP * steps, n_test=PAIRS_PER_STEP,
                                  config=ArithmeticConfig(max_digits=2))
    return {"model": make_model_dir(str(root / f"model-{size}"), size=size, seed=0), "data": data["train"]}


def token_limits(model_dir: str, data_path: str) -> tuple[int, int]:
    """The longest prompt and response (answer + eos) in tokens: our fixed padding lengths, so our rows are no
    longer than TRL's per-batch padding."""
    import pandas as pd

    from verl.workers.worker_utils import load_tokenizer

    tok = load_tokenizer(model_dir)
    df = pd.read_parquet(data_path)
    prompt = max(len(tok(tok.apply_chat_template(list(p), add_generation_prompt=True, tokenize=False),
                         add_special_tokens=False)["input_ids"]) for p in df.prompt)
    answer = max(len(tok(str(a), add_special_tokens=False)["input_ids"]) + 1
                 for a in list(df.chosen) + list(df.rejected))
    return prompt, answer


def run_ours(assets: dict, steps: int, lr: float, precompute: bool, out: Path, share_prompt: bool = True,
             grad_ckpt: str = "off") -> dict:
    out.mkdir(parents=True, exist_ok=True)
    max_prompt, max_response = token_limits(assets["model"], assets["data"])
    args = [
        f"data.train_files={assets['data']}",
        "data.val_files=null",
        f"data.train_batch_size={PAIRS_PER_STEP}",
        f"data.max_prompt_length={max_prompt}",
        f"data.max_response_length={max_response}",
        f"actor_rollout_ref.model.path={assets['model']}",
        f"actor_rollout_ref.model.enable_gradient_checkpointing={grad_ckpt == 'on'}",
        f"actor_rollout_ref.actor.optim.lr={lr}",
        f"dpo.beta={BETA}",
        f"dpo.micro_batch_size_per_gpu={PAIRS_PER_STEP}",
        f"dpo.precompute_ref_log_probs={str(precompute).lower()}",
        f"dpo.share_prompt_prefix={str(share_prompt).lower()}",
        f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={2 * PAIRS_PER_STEP}",
        "trainer.logger=[console,file]",
        "trainer.val_before_train=False",
        "trainer.n_gpus_per_node=1",
        "trainer.save_freq=-1",
        "trainer.test_freq=-1",
        f"trainer.total_training_steps={steps}",
        f"trainer.default_local_dir={out / 'ckpt'}",
    ]
    metrics_path = out / "metrics.jsonl"
    metrics_path.unlink(missing_ok=True)
    env = dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1", RAY_AUTH_MODE="disabled",
               TOKENIZERS_PARALLELISM="false", VERL_FILE_LOGGER_PATH=str(metrics_path))
    with open(out / "log.txt", "w") as log, StepEndWatcher(metrics_path) as watcher:
        proc = subprocess.run([sys.executable, "-m", "recipe.dpo.main_dpo", *args], cwd=out, env=env, stdout=log,
                              stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        raise SystemExit(f"our run failed, see {out / 'log.txt'}")
    by_step = {}
    for line in metrics_path.read_text().splitlines():
        record = json.loads(line)
        if "data" in record:
            by_step.setdefault(record["step"], {}).update(record["data"])
    ordered = [by_step[s] for s in sorted(by_step) if "timing_s/step" in by_step[s]]
    return {"step_s": [float("nan")] + watcher.intervals(), "driver_step_s": [m["timing_s/step"] for m in ordered],
            "update_s": [m.get("perf/update_actor_s", 0.0) for m in ordered],
            "accuracies": [m["train/rewards/accuracies"] for m in ordered],
            "tokens": [max_prompt, max_response]}


def run_trl(python: Path, assets: dict, steps: int, lr: float, precompute: bool, out: Path,
            grad_ckpt: str = "off") -> dict:
    out.mkdir(parents=True, exist_ok=True)
    script = out / "trl_dpo.py"
    script.write_text(TRL_SCRIPT)
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", PYTHONPATH="")
    with open(out / "log.txt", "w") as log:
        proc = subprocess.run([str(python), str(script), assets["model"], assets["data"], str(steps),
                               str(PAIRS_PER_STEP), str(BETA), str(lr), "1" if precompute else "0",
                               str(out / "trl_out"), str(out / "result.json"), grad_ckpt], env=env, stdout=log,
                              stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        raise SystemExit(f"TRL run failed, see {out / 'log.txt'}")
    return json.loads((out / "result.json").read_text())


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", nargs="+", default=["tiny", "small"], choices=["tiny", "small", "base"])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3, help="runs per side, alternating ours / TRL")
    parser.add_argument("--grad_ckpt", default="off", choices=["off", "on"],
                        help="gradient checkpointing, set explicitly on both sides")
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--precompute", action="store_true",
                        help="precompute the reference log-probs once on both sides (default: every step, both sides)")
    parser.add_argument("--no_share_prompt", action="store_true",
                        help="ours computes chosen and rejected as two rows per pair (dpo.share_prompt_prefix=false)")
    parser.add_argument("--trl_venv", default=os.path.join(tempfile.gettempdir(), "trl-venv"))
    parser.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "verl_dpo_vs_trl"))
    parser.add_argument("--skip_trl", action="store_true")
    parser.add_argument("--skip_ours", action="store_true")
    args = parser.parse_args(argv)
    if args.steps < 3:
        parser.error("--steps must be >= 3 (the median is over steps 2..N)")

    sys.path.insert(0, str(REPO))
    work = Path(args.workdir)
    trl_python = None if args.skip_trl else ensure_trl_venv(Path(args.trl_venv))
    sides = ([] if args.skip_ours else ["ours"]) + ([] if args.skip_trl else ["trl"])
    print(f"# fairness: gradient checkpointing {args.grad_ckpt} on both sides; timer = step end to step end on both "
          f"sides (includes collation and logging); {args.repeats} alternating runs per side", flush=True)
    results = []
    for size in args.sizes:
        assets = prepare(work, size, args.steps)
        row = {"size": size, "ours": [], "trl": [], "driver": []}
        for rep in range(args.repeats):
            for side in sides:
                load = os.getloadavg()
                out = work / f"{size}-{side}-{rep}"
                start = time.perf_counter()
                if side == "ours":
                    res = run_ours(assets, args.steps, args.lr, args.precompute, out, not args.no_share_prompt,
                                   args.grad_ckpt)
                    row["driver"].append(median_after_first(res["driver_step_s"]))
                else:
                    res = run_trl(trl_python, assets, args.steps, args.lr, args.precompute, out, args.grad_ckpt)
                row[side].append(median_after_first(res["step_s"]))
                print(f"# {size} {side} run {rep}: steps {[round(s, 3) for s in res['step_s']]} s, tokens (prompt, "
                      f"answer) {res['tokens']}, train rewards/accuracies {[round(a, 2) for a in res['accuracies']]}, "
                      f"wall {time.perf_counter() - start:.0f} s, load average at start "
                      f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}", flush=True)
                if side == "ours":
                    print(f"# {size} ours: update inside the worker (median, steps 2..N) "
                          f"{median_after_first(res['update_s']):.3f} s", flush=True)
        results.append(row)

    def cell(values):
        if not values:
            return "-"
        mid, lo, hi = median_range(values)
        return f"{mid:.3f} [{lo:.3f}, {hi:.3f}]"

    ref = "precomputed once" if args.precompute else "every step"
    layout = "two rows per pair" if args.no_share_prompt else "one packed [prompt | chosen | rejected] row per pair"
    print(f"\n{PAIRS_PER_STEP} pairs per step, fp32, reference log-probs {ref}, ours: {layout}; s/step = median "
          f"over steps 2..N of the loop period, median [min, max] over {args.repeats} runs")
    print(f"{'size':6} {'ours s/step':>24} {'TRL s/step':>24} {'ours pairs/s':>13} {'TRL pairs/s':>12} "
          f"{'ours/TRL':>9} {'ours timing_s/step':>24}")
    for r in results:
        ours = statistics.median(r["ours"]) if r["ours"] else None
        trl = statistics.median(r["trl"]) if r["trl"] else None
        cols = [cell(r["ours"]).rjust(24), cell(r["trl"]).rjust(24),
                f"{PAIRS_PER_STEP / ours:13.1f}" if ours else "-".rjust(13),
                f"{PAIRS_PER_STEP / trl:12.1f}" if trl else "-".rjust(12),
                f"{trl / ours:8.2f}x" if ours and trl else "-".rjust(9), cell(r["driver"]).rjust(24)]
        print(f"{r['size']:6} " + " ".join(cols))
    return results


if __name__ == "__main__":
    main()
