"""Two Ray nodes on one machine: `ray start --head` plus `ray start --address` (1 CPU each, dashboard on
127.0.0.1), then `ray job submit -- python -m verl.trainer.main_ppo trainer.nnodes=2 trainer.n_gpus_per_node=1`
(tiny model, 2 steps). Each node has one CPU and each worker process takes (almost) a whole CPU, so the two
ranks necessarily run on different nodes. The nodes are torn down at the end by killing their processes (their own
process sessions): `ray stop` would also stop every other Ray instance of this user on the machine."""

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from test_main_ppo_e2e import assets, quickstart_args, read_metrics  # noqa: E402,F401

from ray_nodes import RAY, free_ports, kill_sessions, node_ports_args, ray_start, session_pids  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.own_ray]  # starts its own Ray nodes

REPO = Path(__file__).resolve().parents[2]


def test_main_ppo_on_two_ray_nodes_through_ray_job_submit(assets, tmp_path):
    temp = tempfile.mkdtemp(prefix="rn", dir="/tmp")  # short: Ray's unix socket paths have a length limit
    gcs, dash, client, *agent = free_ports(11)
    env = dict(os.environ, RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0", HF_HUB_OFFLINE="1")
    env.pop("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", None)  # "0" (single-machine mode) refuses `ray start --address`
    sids = []
    try:
        ray_start(
            ["--head", "--node-ip-address", "127.0.0.1", "--port", str(gcs), "--num-cpus", "1", "--num-gpus", "0",
             "--include-dashboard", "true", "--dashboard-host", "127.0.0.1", "--dashboard-port", str(dash),
             "--ray-client-server-port", str(client), "--temp-dir", temp,
             *node_ports_args(agent[0:4])],
            env, tmp_path / "head.log", sids)
        ray_start(
            ["--address", f"127.0.0.1:{gcs}", "--node-ip-address", "127.0.0.1", "--num-cpus", "1", "--num-gpus", "0",
             *node_ports_args(agent[4:8])],
            env, tmp_path / "worker.log", sids, attempts=3)
        # the autoscaler's view lags node registration by a few seconds on a busy machine: poll it
        deadline = time.monotonic() + 90
        while True:
            status = subprocess.run([RAY, "status", "--address", f"127.0.0.1:{gcs}"], env=env, capture_output=True,
                                    text=True, timeout=120).stdout
            if "2.0 CPU" in status or time.monotonic() > deadline:
                break
            time.sleep(3)
        assert "2.0 CPU" in status, status

        run = tmp_path / "run"
        run.mkdir()
        # the job's environment goes on its command line: main_ppo sets a runtime env of its own, which Ray
        # refuses to combine with a job-level one
        job_env = [f"PYTHONPATH={REPO}", "HF_HUB_OFFLINE=1", "TOKENIZERS_PARALLELISM=false",
                   "RAY_AUTH_MODE=disabled", f"VERL_FILE_LOGGER_PATH={run / 'metrics.jsonl'}"]
        args = [a for a in quickstart_args(assets, steps=2) if not a.startswith("trainer.n")] + [
            "trainer.nnodes=2", "trainer.n_gpus_per_node=1", f"trainer.default_local_dir={run / 'ckpt'}",
            "trainer.save_freq=2"]
        with open(run / "job.log", "w") as log:
            job = subprocess.run(
                [RAY, "job", "submit", "--address", f"http://127.0.0.1:{dash}", "--",
                 "env", *job_env, sys.executable, "-m", "verl.trainer.main_ppo", *args],
                env=env, stdout=log, stderr=subprocess.STDOUT, timeout=900, cwd=run)
        text = (run / "job.log").read_text()
        assert job.returncode == 0 and "succeeded" in text, text[-6000:]
        metrics = read_metrics(run)
        assert sorted(metrics) == [1, 2], text[-4000:]
        assert metrics[2]["critic/score/mean"] > 0
        assert (run / "ckpt" / "global_step_2" / "actor" / "model_world_size_2_rank_1.pt").exists()
    finally:  # tear both nodes down, bounded: TERM, then KILL what is left after 15 s
        kill_sessions(sids)
    assert not session_pids(sids)
