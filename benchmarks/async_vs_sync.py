"""One-step-off-policy GRPO vs synchronous GRPO: step time and score trend on the same work.

Three sides, the same tiny model, prompts, sampling, reward and seed, the same number of worker processes
(1 + ``--rollout_procs``; on CPU a "gpu" is a process):

- ``colocated`` (the baseline): the usual synchronous ``python -m verl.trainer.main_ppo``, every process both
  trains (FSDP) and generates (hybrid engine), ``trainer.n_gpus_per_node = 1 + rollout_procs``;
- ``sync``: ``python -m verl.experimental.one_step_off_policy.main_ppo`` with split placement (one training
  process, ``rollout.n_gpus_per_node`` rollout processes) and ``rollout.overlap=false``: waits for each update
  before generating;
- ``one_step_off``: the same split pools with ``rollout.overlap=true``: generates batch k+1 while batch k trains.

Start-up is excluded: the step time is the median of ``timing_s/step`` over steps 2..N of each run; ``--repeats``
runs per side, alternating, median and [min, max] over runs. The load average is printed before and after,
because on a machine with fewer cores than processes the pools compete for the same cores and overlap can only
win the idle time each side leaves.

    .venv/bin/python benchmarks/async_vs_sync.py --steps 8 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_utils import median_range  # noqa: E402

from verl.utils.embedded import make_model_dir  # noqa: E402
from verl.utils.embedded.arithmetic import make_rl_rows  # noqa: E402

REWARD_PY = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    digits = sum(ch.isdigit() for ch in solution_str)
    return (1 + digits) / (1 + len(solution_str))
'''


def make_assets(root: Path) -> dict:
    import pandas as pd

    model = make_model_dir(str(root / "model"), size="tiny", seed=0)
    pd.DataFrame(make_rl_rows(256, "train", seed=0)).to_parquet(root / "train.parquet")
    pd.DataFrame(make_rl_rows(8, "test", seed=1)).to_parquet(root / "test.parquet")
    (root / "reward.py").write_text(REWARD_PY)
    return {"model": model, "train": root / "train.parquet", "test": root / "test.parquet",
            "reward": root / "reward.py"}


def run_side(root: Path, a: dict, mode: str, args, rep: int) -> dict:
    run = root / f"{mode}-{rep}"
    run.mkdir()
    common = [f"data.train_files={a['train']}", f"data.val_files={a['test']}",
              f"data.train_batch_size={args.prompts}", "data.max_prompt_length=32",
              f"data.max_response_length={args.tokens}", "data.seed=0",
              f"actor_rollout_ref.model.path={a['model']}", "algorithm.adv_estimator=grpo",
              f"actor_rollout_ref.rollout.n={args.n}", "actor_rollout_ref.rollout.name=hf",
              "actor_rollout_ref.rollout.mode=sync", "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16",
              "actor_rollout_ref.actor.optim.lr=1e-3", f"actor_rollout_ref.actor.ppo_mini_batch_size={args.prompts}",
              "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16", "actor_rollout_ref.actor.fsdp_config.dtype=fp32",
              f"custom_reward_function.path={a['reward']}", "trainer.logger=[console,file]",
              "trainer.val_before_train=False", "trainer.test_freq=-1", "trainer.save_freq=-1", "trainer.device=cpu",
              f"trainer.total_training_steps={args.steps}"]
    if mode == "colocated":
        cmd = [sys.executable, "-m", "verl.trainer.main_ppo", *common,
               f"trainer.n_gpus_per_node={1 + args.rollout_procs}"]
    else:
        cmd = [sys.executable, "-m", "verl.experimental.one_step_off_policy.main_ppo", *common,
               "trainer.n_gpus_per_node=1", f"rollout.n_gpus_per_node={args.rollout_procs}",
               f"rollout.overlap={mode == 'one_step_off'}"]
    env = dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1", RAY_AUTH_MODE="disabled",
               TOKENIZERS_PARALLELISM="false", VERL_FILE_LOGGER_PATH=str(run / "metrics.jsonl"))
    with open(run / "log.txt", "w") as log:
        proc = subprocess.run(cmd, cwd=run, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=3000)
    if proc.returncode != 0:
        raise SystemExit(f"{run.name} failed:\n" + (run / "log.txt").read_text()[-4000:])
    steps: dict[int, dict] = {}
    for line in (run / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if "data" in rec:
            steps.setdefault(rec["step"], {}).update(rec["data"])
    return steps


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--n", type=int, default=4)
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--rollout_procs", type=int, default=1)
    p.add_argument("--repeats", type=int, default=3, help="runs per side, alternating")
    args = p.parse_args()
    print(f"load average before: {os.getloadavg()}  cores: {os.cpu_count()}", flush=True)
    modes = ("colocated", "sync", "one_step_off")
    times: dict[str, list[float]] = {m: [] for m in modes}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        a = make_assets(root)
        for rep in range(args.repeats):
            for mode in modes:
                steps = run_side(root, a, mode, args, rep)
                later = [k for k in sorted(steps) if k >= 2]
                times[mode].append(statistics.median(steps[k]["timing_s/step"] for k in later))
                gen = statistics.median(steps[k]["timing_s/gen"] for k in later)
                upd = statistics.median(steps[k].get("timing_s/update_actor", 0.0) for k in later)
                print(f"{mode:13s} run {rep}: step {times[mode][-1]:.2f} s (gen wait {gen:.2f} s, update_actor "
                      f"{upd:.2f} s); critic/score/mean per step: "
                      + " ".join(f"{steps[k]['critic/score/mean']:.3f}" for k in sorted(steps)), flush=True)
    print(f"load average after: {os.getloadavg()}")
    base = statistics.median(times["colocated"])
    for mode in modes:
        mid, lo, hi = median_range(times[mode])
        print(f"{mode:13s} step {mid:.2f} s [{lo:.2f}, {hi:.2f}] over {args.repeats} runs; colocated / {mode}: "
              f"{base / mid:.2f}x")


if __name__ == "__main__":
    main()
