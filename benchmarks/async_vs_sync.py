"""One-step-off-policy GRPO vs synchronous GRPO: step time and score trend on the same work and the same pools.

Both sides run ``python -m verl.experimental.one_step_off_policy.main_ppo`` with split placement (one training
process, ``rollout.n_gpus_per_node`` rollout processes; on CPU a "gpu" is a process), the same tiny model,
prompts, sampling, reward and seed. The only difference is ``rollout.overlap``: true generates batch k+1 while
batch k trains (one-step-off), false waits for each update before generating (synchronous GRPO). Start-up is
excluded: the step time is the median of ``timing_s/step`` over steps 2..N. The load average is printed before
and after, because on a machine with fewer cores than processes the two pools compete for the same cores and
overlap can only win the idle time each side leaves.

    .venv/bin/python benchmarks/async_vs_sync.py --steps 8
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


def run_side(root: Path, a: dict, overlap: bool, args) -> dict:
    run = root / ("one_step_off" if overlap else "sync")
    run.mkdir()
    cmd = [sys.executable, "-m", "verl.experimental.one_step_off_policy.main_ppo",
           f"data.train_files={a['train']}", f"data.val_files={a['test']}",
           f"data.train_batch_size={args.prompts}", "data.max_prompt_length=32",
           f"data.max_response_length={args.tokens}", "data.seed=0",
           f"actor_rollout_ref.model.path={a['model']}", "algorithm.adv_estimator=grpo",
           f"actor_rollout_ref.rollout.n={args.n}", "actor_rollout_ref.rollout.name=hf",
           "actor_rollout_ref.rollout.mode=sync", "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16",
           "actor_rollout_ref.actor.optim.lr=1e-3", f"actor_rollout_ref.actor.ppo_mini_batch_size={args.prompts}",
           "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16", "actor_rollout_ref.actor.fsdp_config.dtype=fp32",
           f"custom_reward_function.path={a['reward']}", "trainer.logger=[console,file]",
           "trainer.val_before_train=False", "trainer.test_freq=-1", "trainer.save_freq=-1", "trainer.device=cpu",
           "trainer.n_gpus_per_node=1", f"rollout.n_gpus_per_node={args.rollout_procs}",
           f"trainer.total_training_steps={args.steps}", f"rollout.overlap={overlap}"]
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
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--n", type=int, default=4)
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--rollout_procs", type=int, default=1)
    args = p.parse_args()
    print(f"load average before: {os.getloadavg()}  cores: {os.cpu_count()}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        a = make_assets(root)
        sides = {name: run_side(root, a, overlap, args) for name, overlap in (("sync", False), ("one_step_off", True))}
    print(f"load average after: {os.getloadavg()}")
    times = {}
    for name, steps in sides.items():
        later = [steps[k]["timing_s/step"] for k in sorted(steps) if k >= 2]
        times[name] = statistics.median(later)
        gen = statistics.median([steps[k]["timing_s/gen"] for k in sorted(steps) if k >= 2])
        upd = statistics.median([steps[k].get("timing_s/update_actor", 0.0) for k in sorted(steps) if k >= 2])
        print(f"{name:13s} step {times[name]:.2f} s (median of steps 2..{args.steps}; gen wait {gen:.2f} s, "
              f"update_actor {upd:.2f} s)")
        print(f"{'':13s} critic/score/mean per step: "
              + " ".join(f"{steps[k]['critic/score/mean']:.3f}" for k in sorted(steps)))
    print(f"speed-up (sync step / one-step-off step): {times['sync'] / times['one_step_off']:.2f}x")


if __name__ == "__main__":
    main()
