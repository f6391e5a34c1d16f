"""One GRPO step on SmolLM2-135M-Instruct: ours vs TRL's GRPOTrainer, and ours vs the compute floor.

    .venv/bin/python benchmarks/real_model_vs_trl.py --prompts 4 --samples 4 --tokens 256 --steps 3

Identical work per step on both sides: the same model directory (``examples/models/prepare_smollm2.py``), the
same GSM-style prompts in the same order (``examples/data_preprocess/gsm_symbolic.py``), ``--prompts`` x
``--samples`` completions of exactly ``--tokens`` tokens (ours ``rollout.ignore_eos=True``, TRL
``min_new_tokens``), temperature 1, the same reward function, one AdamW step per batch, no KL term, fp32.
Our side is the command line a verl user writes (vLLM rollout, FSDP2 actor), no tuning keys; TRL runs its CPU
path (HF ``generate``) in its own virtualenv (see ``grpo_vs_trl.py``).

Fairness settings (both sides): gradient checkpointing off on both (set explicitly; TRL's own default is on);
the same timer -- the training loop's period, step end to step end (TRL's ``on_step_end`` callback; ours, the
moment each step's metrics line lands in the file logger), so both include prompt tokenisation and logging.
``--repeats`` runs per side (default 3), alternating ours / TRL; each run's median over steps 2..N, then the
median [min, max] over runs.

The floor is the same batch through the bare engines in one process each, no framework around them: vLLM
generation (in-process engine, same sampling) + one Hugging Face forward/backward/AdamW step over the
prompt+completion tokens (LM head on the completion positions only). Printed: seconds per step (median over steps
2..N), TRL / ours (> 1: ours faster; goal >= 2.5x) and ours / floor (1.0 would be no overhead at all), with our
step breakdown.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_utils import median_range  # noqa: E402
from grpo_vs_trl import (REWARD_PY, breakdown_line, ensure_trl_venv, median_after_first,  # noqa: E402
                         run_ours, run_trl)

HOME = Path.home()
FLOOR_SCRIPT = textwrap.dedent('''
    import json, os, statistics, sys, time
    os.environ.update(VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_CPU_NUM_OF_RESERVED_CPU="0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    import pandas as pd
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    part, model_dir, data_path, prompts, samples, tokens, reps, out_json = sys.argv[1:9]
    prompts, samples, tokens, reps = int(prompts), int(samples), int(tokens), int(reps)
    tok = AutoTokenizer.from_pretrained(model_dir)
    chats = [list(p) for p in pd.read_parquet(data_path)["prompt"][:prompts]]
    prompt_ids = [tok.apply_chat_template(c, add_generation_prompt=True, tokenize=False) for c in chats]
    prompt_ids = [tok(t, add_special_tokens=False)["input_ids"] for t in prompt_ids]
    times = []
    if part == "gen":
        from vllm import LLM, SamplingParams
        llm = LLM(model=model_dir, dtype="float32", enforce_eager=True, distributed_executor_backend="uni",
                  max_model_len=max(map(len, prompt_ids)) + tokens, max_num_seqs=prompts * samples, seed=0)
        params = SamplingParams(n=samples, temperature=1.0, max_tokens=tokens, ignore_eos=True, logprobs=0)
        for _ in range(reps + 1):
            start = time.perf_counter()
            llm.generate([{"prompt_token_ids": p} for p in prompt_ids], params, use_tqdm=False)
            times.append(time.perf_counter() - start)
    else:
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa")
        opt = torch.optim.AdamW(model.parameters(), lr=1e-6, weight_decay=0.01)
        width = max(map(len, prompt_ids)) + tokens
        rows = [p + [tok.eos_token_id] * tokens for p in prompt_ids for _ in range(samples)]
        ids = torch.full((len(rows), width), tok.pad_token_id or 0)
        mask = torch.zeros_like(ids)
        for i, r in enumerate(rows):  # left-padded prompts, as a rollout batch is
            ids[i, width - len(r):] = torch.tensor(r)
            mask[i, width - len(r):] = 1
        for _ in range(reps + 1):
            start = time.perf_counter()
            # the LM head on the completion positions only (logits_to_keep), as both trainers do
            logits = model(input_ids=ids, attention_mask=mask, logits_to_keep=tokens + 1).logits[:, :-1].float()
            logp = torch.log_softmax(logits, -1).gather(-1, ids[:, -tokens:, None]).squeeze(-1)
            (-logp.mean()).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad()
            times.append(time.perf_counter() - start)
    json.dump({"s": statistics.median(times[1:])}, open(out_json, "w"))
''')


def prepare(work: Path, data: Path, prompts: int, steps: int) -> Path:
    """The first ``prompts * steps`` rows of the train split, as one parquet both sides read in order."""
    import pandas as pd

    work.mkdir(parents=True, exist_ok=True)
    subset = work / "train.parquet"
    pd.read_parquet(data).head(prompts * steps).to_parquet(subset)
    (work / "reward.py").write_text(REWARD_PY)
    return subset


def floor(part: str, model: Path, data: Path, prompts: int, samples: int, tokens: int, out: Path) -> float:
    out.mkdir(parents=True, exist_ok=True)
    script, result = out / "floor.py", out / f"floor_{part}.json"
    script.write_text(FLOOR_SCRIPT)
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    with open(out / f"floor_{part}.log", "w") as log:
        proc = subprocess.run([sys.executable, str(script), part, str(model), str(data), str(prompts), str(samples),
                               str(tokens), "2", str(result)], env=env, stdout=log, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        raise SystemExit(f"floor ({part}) failed, see {out / f'floor_{part}.log'}")
    return json.loads(result.read_text())["s"]


class PeakRSS:
    """Peak total resident memory of the processes started while the block runs (the run's whole process tree:
    Ray's raylet, workers and engines included), sampled every 0.5 s; ``.gib`` after the block."""

    def __init__(self):
        import psutil

        self._psutil = psutil
        self._before = set(psutil.pids()) - {os.getpid()}
        self.gib = 0.0
        self._stop = None

    def _sample(self) -> float:
        total = 0
        for proc in self._psutil.process_iter(["pid"]):
            if proc.info["pid"] in self._before:
                continue
            try:
                total += proc.memory_info().rss
            except (self._psutil.NoSuchProcess, self._psutil.AccessDenied):
                pass
        return total / 2**30

    def __enter__(self):
        import threading

        self._stop = threading.Event()

        def loop():
            while not self._stop.is_set():
                self.gib = max(self.gib, self._sample())
                self._stop.wait(0.5)

        self._thread = threading.Thread(target=loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        return False


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=str(HOME / "models" / "SmolLM2-135M-Instruct"))
    parser.add_argument("--data", default=str(HOME / "data" / "gsm_symbolic" / "train.parquet"))
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=256, help="completion length, forced on both sides")
    parser.add_argument("--steps", type=int, default=3, help="steps per side (the first is not timed)")
    parser.add_argument("--lr", type=float, default=1e-6)
    parser.add_argument("--repeats", type=int, default=3, help="runs per side, alternating ours / TRL")
    parser.add_argument("--trl_venv", default=os.path.join(tempfile.gettempdir(), "trl-venv"))
    parser.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "verl_real_model_vs_trl"))
    parser.add_argument("--skip_trl", action="store_true")
    parser.add_argument("--skip_floor", action="store_true")
    args = parser.parse_args(argv)

    model, data, work = Path(args.model), Path(args.data), Path(args.workdir)
    if not (model / "config.json").exists():
        raise SystemExit(f"--model {model}: no config.json; make it with "
                         f"`python examples/models/prepare_smollm2.py --out {model}`")
    if not data.exists():
        raise SystemExit(f"--data {data}: not found; make it with "
                         f"`python examples/data_preprocess/gsm_symbolic.py --local_save_dir {data.parent}`")
    trl_python = None if args.skip_trl else ensure_trl_venv(Path(args.trl_venv))
    subset = prepare(work, data, args.prompts, args.steps)
    assets = {"model": str(model), "data": subset, "reward": work / "reward.py"}
    shape = dict(prompts=args.prompts, samples=args.samples)
    print(f"# SmolLM2-135M fp32: {args.prompts} prompts x {args.samples} samples x {args.tokens} tokens per step, "
          f"{args.steps} steps per side, load avg {os.getloadavg()[0]:.1f}", flush=True)

    runs: dict[str, list[float]] = {"ours": [], "trl": []}
    peaks: dict[str, list[float]] = {"ours": [], "trl": []}
    for rep in range(args.repeats):
        with PeakRSS() as rss:
            ours = run_ours(assets, args.tokens, "fp32", args.steps, args.lr, 1, work / f"ours{rep}",
                            max_prompt_length=256, **shape)
        runs["ours"].append(median_after_first(ours["step_s"]))
        peaks["ours"].append(rss.gib)
        print(f"# ours run {rep}: steps {[round(s, 2) for s in ours['step_s']]} s, peak RSS {rss.gib:.2f} GiB; "
              f"breakdown: {breakdown_line(runs['ours'][-1], ours['breakdown'])}", flush=True)
        if trl_python is not None:
            with PeakRSS() as rss:
                trl = run_trl(trl_python, assets, args.tokens, "fp32", args.steps, args.lr, work / f"trl{rep}",
                              **shape)
            runs["trl"].append(median_after_first(trl["step_s"]))
            peaks["trl"].append(rss.gib)
            print(f"# TRL run {rep}: steps {[round(s, 2) for s in trl['step_s']]} s, peak RSS {rss.gib:.2f} GiB, "
                  f"completion lengths {trl['length']}", flush=True)
    row = {"ours": median_range(runs["ours"]), "ours_peak_rss_gib": max(peaks["ours"])}
    if runs["trl"]:
        row["trl"], row["trl_peak_rss_gib"] = median_range(runs["trl"]), max(peaks["trl"])
    if not args.skip_floor:
        row["floor_gen"] = floor("gen", model, subset, args.prompts, args.samples, args.tokens, work / "floor")
        row["floor_train"] = floor("train", model, subset, args.prompts, args.samples, args.tokens, work / "floor")
        row["floor"] = row["floor_gen"] + row["floor_train"]
        print(f"# floor: vLLM generation {row['floor_gen']:.2f} s + HF forward/backward/AdamW "
              f"{row['floor_train']:.2f} s = {row['floor']:.2f} s", flush=True)

    ours_mid = row["ours"][0]
    print(f"\nours {ours_mid:.2f} s/step [{row['ours'][1]:.2f}, {row['ours'][2]:.2f}]", end="")
    if "trl" in row:
        trl_mid = row["trl"][0]
        print(f" | TRL {trl_mid:.2f} s/step [{row['trl'][1]:.2f}, {row['trl'][2]:.2f}] -> TRL/ours "
              f"{trl_mid / ours_mid:.2f}x (goal >= 2.5x)", end="")
    if "floor" in row:
        print(f" | floor {row['floor']:.2f} s -> ours/floor {ours_mid / row['floor']:.2f}", end="")
    print(f"  ({args.repeats} alternating runs per side, median [min, max])", flush=True)
    return row


if __name__ == "__main__":
    main()
