"""Fault tolerance of `python -m verl.trainer.main_ppo` with real process kills (CPU workers, Ray, tiny model).

- `kill -9` of one worker process in the middle of a step: the driver stops within 30 s with an error naming the
  role, the rank and the last complete checkpoint (never a hang); the 2-rank checkpoint it left then resumes on
  1 rank (`trainer.n_gpus_per_node=1`, resharded on load) and continues at the next step.
- A crash while a checkpoint is written leaves the previous one usable: a leftover ``*.tmp`` folder or a step
  folder without the marker is ignored by `trainer.resume_mode=auto` (unit test of the driver's lookup).

The kill of the driver itself (during a checkpoint write, then resume with identical metrics) is
``test_main_ppo_e2e.py::test_checkpoint_kill_resume_identical_metrics``.
"""

import os
import signal
import subprocess
import sys
import time

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from test_main_ppo_e2e import _env, assets, quickstart_args, read_metrics, run_main  # noqa: E402,F401

from verl.trainer.ppo.checkpoint import find_latest_ckpt_path, mark_latest  # noqa: E402

CKPT = ("checkpoints", "verl_examples", "gsm8k")


def _session_workers(sid: int, name: str) -> list[int]:
    """pids of the Ray worker processes titled ``ray::<name>...`` in process session ``sid``."""
    out = subprocess.run(["ps", "-eo", "pid=,sid=,args="], capture_output=True, text=True, check=True).stdout
    pids = []
    for line in out.splitlines():
        pid, session, args = line.split(None, 2)
        if int(session) == sid and args.startswith(f"ray::{name}"):
            pids.append(int(pid))
    return sorted(pids)


@pytest.mark.e2e
@pytest.mark.own_ray  # kills a worker process of the run: the run must start its own Ray (workers in its session)
def test_dead_worker_stops_the_driver_with_a_named_error_then_resumes_on_one_rank(assets, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    args = quickstart_args(assets, steps=30) + ["trainer.save_freq=1"]
    marker = run.joinpath(*CKPT, "latest_checkpointed_iteration.txt")
    with open(run / "log.txt", "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "verl.trainer.main_ppo", *args], cwd=run, env=_env(run),
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            deadline = time.time() + 600
            while time.time() < deadline and proc.poll() is None and not (marker.exists() and marker.read_text()):
                time.sleep(0.2)
            assert proc.poll() is None, (run / "log.txt").read_text()[-4000:]
            time.sleep(1.0)  # into the next step
            workers = _session_workers(proc.pid, "WorkerDict")
            assert len(workers) == 2, workers  # actor+critic colocated on 2 processes
            victim = workers[-1]
            killed_at = time.time()
            os.kill(victim, signal.SIGKILL)
            proc.wait(timeout=60)
            stopped_after = time.time() - killed_at
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=60)
    log_text = (run / "log.txt").read_text()
    assert proc.returncode != 0
    assert stopped_after < 30, f"the driver needed {stopped_after:.1f} s to stop"
    last = find_latest_ckpt_path(str(run.joinpath(*CKPT)))
    assert last is not None
    assert f"last complete checkpoint: {last}" in log_text, log_text[-4000:]
    assert "role 'actor_rollout' rank" in log_text or "role 'critic' rank" in log_text, log_text[-4000:]
    assert f"pid: {victim}" in log_text  # the rank named is the process that was killed
    deadline = time.time() + 20
    while _session_workers(proc.pid, "") and time.time() < deadline:
        time.sleep(0.5)
    assert not _session_workers(proc.pid, "")  # nothing of that run's Ray is left

    # the 2-rank checkpoint resumes on 1 rank and continues at the next step
    step = int(os.path.basename(last).split("_")[-1])
    (run / "metrics.jsonl").unlink(missing_ok=True)
    one_rank = [a for a in args if not a.startswith(("trainer.n_gpus_per_node", "trainer.total_training_steps"))]
    resumed = run_main(run, one_rank + ["trainer.n_gpus_per_node=1", f"trainer.total_training_steps={step + 1}"])
    assert sorted(resumed) == [step + 1], sorted(resumed)
    assert f"Resuming from {last}" in (run / "log.txt").read_text()
    assert resumed[step + 1]["training/global_step"] == step + 1
    assert resumed[step + 1]["critic/score/mean"] > 0


def test_interrupted_checkpoint_write_leaves_the_previous_one(tmp_path):
    root = tmp_path / "ckpt"
    for step in (2, 4):
        (root / f"global_step_{step}" / "actor").mkdir(parents=True)
    mark_latest(str(root), 2)
    # step 4's save was cut short: its actor folder never left .tmp, its critic never came, no marker update
    (root / "global_step_4" / "actor").rename(root / "global_step_4" / "actor.tmp")
    (root / "latest_checkpointed_iteration.txt.tmp").write_text("4")  # a marker write that never got renamed
    assert find_latest_ckpt_path(str(root)) == str(root / "global_step_2")
    # no marker at all (the first save crashed): nothing to resume, the run starts from scratch
    (root / "latest_checkpointed_iteration.txt").unlink()
    assert find_latest_ckpt_path(str(root)) is None
