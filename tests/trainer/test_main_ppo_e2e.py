"""End-to-end: `python -m verl.trainer.main_ppo ...` on the embedded tiny model, CPU workers, Ray.

- PPO with GAE + critic: verl's quickstart command line (rollout.name=hf), 2 steps, episodes traced to MLflow
  (rollout.trace.backend=mlflow);
- GRPO: rollout.n=4, KL as a loss (reference policy in its own worker group), 3 steps, with torch traces of step 1
  (global_profiler.tool=torch) for the actor and the reference, on a user's engine and rollout registered through
  ``model.external_lib`` (``strategy=my_strategy``, ``rollout.name=my_rollout``);
- split placement: actor/rollout/ref on one process, critic on the other (Python API, verl's example);
- checkpoint, kill the run (SIGKILL, during a checkpoint write), resume: the resumed steps log the same metrics as
  an uninterrupted run.

Each run is a subprocess in its own directory (its own Ray instance); metrics come from the `file` logger.
"""

import importlib.util
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.trainer.registry_plugin import markers, write_plugin

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]

# a dense, deterministic reward so that advantages, losses and KL are not all zero on an untrained model
REWARD_PY = textwrap.dedent('''
    def compute_score(data_source, solution_str, ground_truth, extra_info=None):
        digits = sum(ch.isdigit() for ch in solution_str)
        return (1 + digits) / (1 + len(solution_str))  # > 0 for every response, varies with the text
''')


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    import pandas as pd

    from verl.utils.embedded import make_model_dir
    from verl.utils.embedded.arithmetic import make_rl_rows

    root = tmp_path_factory.mktemp("e2e_assets")
    model = make_model_dir(str(root / "model"), size="tiny", seed=0)
    pd.DataFrame(make_rl_rows(32, "train", seed=0)).to_parquet(root / "train.parquet")
    pd.DataFrame(make_rl_rows(16, "train", seed=3)).to_parquet(root / "train16.parquet")
    pd.DataFrame(make_rl_rows(8, "test", seed=1)).to_parquet(root / "test.parquet")
    (root / "reward.py").write_text(REWARD_PY)
    return {"root": root, "model": model, "train": root / "train.parquet", "train16": root / "train16.parquet",
            "test": root / "test.parquet", "reward": root / "reward.py"}


TEMPLATE = "<<{% for m in messages %}{{ m['content'] }}{% endfor %}>>"


def quickstart_args(a, steps=2):
    """verl's PPO quickstart command line, scaled down to the tiny model and CPU workers."""
    return [
        f"data.train_files={a['train']}",
        f"data.val_files={a['test']}",
        "data.train_batch_size=8",
        "data.max_prompt_length=32",
        "data.max_response_length=16",
        f"actor_rollout_ref.model.path={a['model']}",
        "actor_rollout_ref.actor.optim.lr=1e-3",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.rollout.name=hf",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.4",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.actor.fsdp_config.dtype=fp32",
        "actor_rollout_ref.ref.fsdp_config.dtype=fp32",
        "critic.optim.lr=1e-3",
        f"critic.model.path={a['model']}",
        "critic.ppo_micro_batch_size_per_gpu=2",
        "critic.model.fsdp_config.dtype=fp32",
        "algorithm.kl_ctrl.kl_coef=0.001",
        f"custom_reward_function.path={a['reward']}",
        "trainer.logger=[console,file]",
        "trainer.val_before_train=False",
        "trainer.n_gpus_per_node=2",
        "trainer.nnodes=1",
        "trainer.save_freq=10",
        "trainer.test_freq=10",
        "trainer.total_epochs=15",
        f"trainer.total_training_steps={steps}",
    ]


def _env(run_dir):
    return dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1", RAY_AUTH_MODE="disabled",
                TOKENIZERS_PARALLELISM="false", VERL_FILE_LOGGER_PATH=str(run_dir / "metrics.jsonl"),
                RAY_DEDUP_LOGS="0", PYTHONUNBUFFERED="1")


def run_main(run_dir, args, timeout=900, pythonpath=None):
    run_dir.mkdir(parents=True, exist_ok=True)
    env = _env(run_dir)
    if pythonpath:  # the driver and the Ray workers it starts import modules from there
        env["PYTHONPATH"] = f"{pythonpath}{os.pathsep}{env['PYTHONPATH']}"
    with open(run_dir / "log.txt", "w") as log:
        proc = subprocess.run([sys.executable, "-m", "verl.trainer.main_ppo", *args], cwd=run_dir, env=env,
                              stdout=log, stderr=subprocess.STDOUT, timeout=timeout)
    assert proc.returncode == 0, (run_dir / "log.txt").read_text()[-6000:]
    return read_metrics(run_dir)


def read_metrics(run_dir):
    steps = {}
    path = run_dir / "metrics.jsonl"
    if path.exists():
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if "data" in record:
                steps.setdefault(record["step"], {}).update(record["data"])
    return steps


# rollout tracing rides along with the quickstart run (a few seconds; tests/utils/test_rollout_trace.py has the rest)
TRACED = importlib.util.find_spec("mlflow") is not None and importlib.util.find_spec("sqlalchemy") is not None
TRACE_ARGS = ["actor_rollout_ref.rollout.trace.backend=mlflow", "actor_rollout_ref.rollout.trace.token2text=True",
              "actor_rollout_ref.rollout.trace.max_samples_per_step_per_worker=1"] if TRACED else []


def test_ppo_gae_quickstart(assets, tmp_path, monkeypatch):
    run = tmp_path / "ppo"
    # the store, named: the e2e runs join the session's Ray cluster, whose workers do not run in the driver's
    # directory (where the default ./mlflow.db is); the driver passes MLFLOW_TRACKING_URI on to the workers
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{run / 'mlflow.db'}")
    # 6 prompts in mini-batches of 4, as verl allows: each worker's 3 rows are a mini-batch of 2, then one of 1
    # (actor and critic)
    metrics = run_main(run, quickstart_args(assets, steps=2) + ["trainer.test_freq=2", "trainer.save_freq=2",
                                                                  "trainer.val_before_train=True",
                                                                  "data.train_batch_size=6", *TRACE_ARGS])
    assert sorted(metrics) == [0, 1, 2]
    assert "val-core/arithmetic/reward/mean@1" in metrics[0]
    for step in (1, 2):
        m = metrics[step]
        assert m["training/global_step"] == step and m["training/epoch"] == 0
        for name in ("actor/pg_loss", "actor/ppo_kl", "actor/entropy", "critic/vf_loss", "critic/score/mean",
                     "critic/values/mean", "critic/advantages/mean", "response_length/mean", "timing_s/gen",
                     "timing_s/update_actor", "timing_s/update_critic", "timing_s/step", "perf/throughput",
                     "training/rollout_probs_diff_max", "training/rollout_probs_diff_mean"):
            assert name in m, f"step {step}: {name} missing"
        # the hybrid engine's rollout and the trainer agree on the sampled tokens' probabilities (fp32)
        assert m["training/rollout_probs_diff_max"] < 1e-3
        assert m["critic/score/mean"] > 0
    assert "val-core/arithmetic/reward/mean@1" in metrics[2]  # test_freq=2 -> validated at the last step
    ckpt = run / "checkpoints" / "verl_examples" / "gsm8k"
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text() == "2"
    for part in ("actor", "critic", "data.pt"):
        assert (ckpt / "global_step_2" / part).exists(), part
    assert (ckpt / "training_curves.png").stat().st_size > 1000
    log = (run / "log.txt").read_text()
    assert "step:2 - " in log  # the console logger's line
    assert f"Training curves: {ckpt / 'training_curves.png'}" in log
    if TRACED:  # each of the 2 rollout workers traced 1 episode per step (experiment = trainer.project_name)
        import mlflow

        client = mlflow.MlflowClient(f"sqlite:///{run / 'mlflow.db'}")
        traces = client.search_traces(locations=[client.get_experiment_by_name("verl_examples").experiment_id])
        steps = sorted((t.info.tags["validate"], t.info.tags["step"]) for t in traces)
        assert steps == [("False", "1")] * 2 + [("False", "2")] * 2 + [("True", "0")] * 2 + [("True", "2")] * 2
        assert {t.info.tags["experiment_name"] for t in traces} == {"gsm8k"}
        generate = traces[0].search_spans(name="AsyncLLMServerManager.generate")[0]
        assert generate.outputs["token_ids"] and isinstance(generate.outputs["text"], str)  # token2text


def test_grpo_n4_kl_loss(assets, tmp_path):
    args = quickstart_args(assets, steps=3) + [
        "algorithm.adv_estimator=grpo",
        "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.actor.use_kl_loss=True",
        "actor_rollout_ref.actor.kl_loss_coef=0.1",
        "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
        "data.train_batch_size=4",
        # torch traces of step 1 for the actor's and the reference's worker calls (docs/profiling.md)
        "global_profiler.tool=torch", "global_profiler.steps=[1]", "global_profiler.save_path=profile",
        "actor_rollout_ref.actor.profiler.enable=True", "actor_rollout_ref.ref.profiler.enable=True",
        # a user's engine and rollout, registered in the module external_lib names (open registries): the
        # FSDP engine and HF generate underneath, counting their calls (tests/trainer/registry_plugin.py)
        "actor_rollout_ref.model.external_lib=my_verl_plugin", "actor_rollout_ref.actor.strategy=my_strategy",
        "actor_rollout_ref.rollout.name=my_rollout",
        # verl's custom chat template: the prompts are rendered with it (the dumped rollouts show its markers)
        f"actor_rollout_ref.model.custom_chat_template=\"{TEMPLATE}\"",
        f"trainer.rollout_data_dir={tmp_path / 'grpo' / 'rollouts'}",
    ]
    lib = tmp_path / "lib"
    write_plugin(lib)
    run = tmp_path / "grpo"
    metrics = run_main(run, args, pythonpath=lib)
    assert sorted(metrics) == [1, 2, 3]
    # both worker processes built the user's engine for the actor and the reference (which follows the actor's
    # strategy) and the user's rollout, and used them every step; the engine's own metric reaches the driver
    seen = markers(lib)
    assert seen.get("engine_build_actor") == seen.get("engine_build_ref") == seen.get("rollout_init") == 2, seen
    assert seen.get("engine_step") == 2 and seen.get("rollout_generate") == 2, seen
    assert 1 <= metrics[1]["my_engine/optimizer_steps"] < metrics[3]["my_engine/optimizer_steps"]
    for step in (1, 2, 3):
        m = metrics[step]
        assert "actor/kl_loss" in m and "actor/pg_loss" in m
        assert not any(k.startswith("critic/vf_") for k in m), "GRPO runs without a critic"
        assert m["response_length/mean"] > 0
    assert metrics[1]["actor/kl_loss"] == pytest.approx(0.0, abs=1e-6)  # actor == reference at step 1
    assert metrics[3]["actor/kl_loss"] > 0  # the actor moved away from the reference
    check_step_1_traces(run / "profile")
    rows = [json.loads(line) for line in (run / "rollouts" / "1.jsonl").read_text().splitlines()]
    assert len(rows) == 4 * 4 and all(r["input"].lstrip().startswith("<<") and ">>" in r["input"] for r in rows), rows[0]


def trace_names(path):
    import gzip

    with gzip.open(path, "rt") as f:
        return {e.get("name") for e in json.load(f)["traceEvents"]}


def check_step_1_traces(profile):
    """Rank 0 of each enabled role wrote a Chrome trace per worker call of step 1, and nothing else."""
    traces = sorted(p.relative_to(profile).as_posix() for p in profile.rglob("*.json.gz"))
    for role in ("rollout_generate", "ref_compute_log_prob", "actor_update"):
        assert f"1/{role}/prof_rank-0.pt.trace.json.gz" in traces, traces
    assert all(t.startswith("1/") and "prof_rank-0" in t for t in traces), traces  # step 1, rank 0 only
    update = trace_names(profile / "1/actor_update/prof_rank-0.pt.trace.json.gz")
    assert "update_actor" in update and "aten::mm" in update  # the worker's call and its forward matmuls
    assert any(n and n.startswith("autograd::engine::evaluate_function") for n in update)  # its backward
    ref = trace_names(profile / "1/ref_compute_log_prob/prof_rank-0.pt.trace.json.gz")
    assert "aten::mm" in ref and not any(n and "Backward" in n for n in ref)  # forward only
    # the picture docs/profiling.md shows: the worker call is the outermost slice, the rest nests inside it
    from verl.utils.profiler.timeline import load_slices, main

    slices = load_slices(str(profile / "1/actor_update/prof_rank-0.pt.trace.json.gz"))
    outer = [e for e in slices if e["depth"] == 0]
    assert [e["name"] for e in outer] == ["update_actor"] and max(e["depth"] for e in slices) >= 3
    picture = profile / "actor_update.png"
    assert main([str(profile / "1/actor_update/prof_rank-0.pt.trace.json.gz"), "--out", str(picture)]) == 0
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


SPLIT_SCRIPT = textwrap.dedent('''
    import sys
    from hydra import compose, initialize_config_dir
    from verl.trainer.main_ppo import CONFIG_DIR, run_ppo
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        cfg = compose(config_name="ppo_trainer", overrides=sys.argv[1:])
    run_ppo(cfg, placement="split")
''')


def test_split_placement(assets, tmp_path):
    run = tmp_path / "split"
    run.mkdir()
    (run / "split.py").write_text(SPLIT_SCRIPT)
    args = quickstart_args(assets, steps=2) + ["actor_rollout_ref.actor.use_kl_loss=True"]
    with open(run / "log.txt", "w") as log:
        proc = subprocess.run([sys.executable, str(run / "split.py"), *args], cwd=run, env=_env(run), stdout=log,
                              stderr=subprocess.STDOUT, timeout=900)
    text = (run / "log.txt").read_text()
    assert proc.returncode == 0, text[-6000:]
    metrics = read_metrics(run)
    assert sorted(metrics) == [1, 2]
    assert "critic/vf_loss" in metrics[2] and "actor/kl_loss" in metrics[2]
    # one process per pool: the actor's dp world is 1, the critic's is 1
    assert "actor_rollout_ref_pool" in text and "critic_pool" in text


def _comparable(m):
    return {k: v for k, v in m.items() if not k.startswith(("timing_s/", "timing_per_token_ms/", "perf/"))
            and not k.endswith("_s")}


def _kill_session(sid):
    """SIGKILL every process of session ``sid`` until none is left."""
    deadline = time.time() + 60
    while time.time() < deadline:
        out = subprocess.run(["ps", "-eo", "pid=,sid=,stat="], capture_output=True, text=True).stdout
        pids = [int(p) for p, s, st in (ln.split() for ln in out.splitlines()) if int(s) == sid and "Z" not in st]
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.2)


def test_checkpoint_kill_resume_identical_metrics(assets, tmp_path):
    # 16 prompts, batch 8: 2 steps per epoch, so the resumed part also crosses an epoch boundary
    args = quickstart_args(assets, steps=4) + [
        f"data.train_files={assets['train16']}", "trainer.save_freq=2", "data.seed=7",
        "actor_rollout_ref.actor.fsdp_config.seed=42",
    ]
    full = run_main(tmp_path / "full", args)
    assert sorted(full) == [1, 2, 3, 4]

    # the same run, driver and workers killed (SIGKILL) in the middle of step 4's checkpoint write. A FIFO in
    # place of step 4's data.pt holds the driver there (opening it for writing blocks until a reader comes, and none
    # does): the actor's shards are written, the loader state and the latest-step marker are not, whatever the
    # host's speed
    run = tmp_path / "killed"
    ckpt = run / "checkpoints" / "verl_examples" / "gsm8k"
    marker = ckpt / "latest_checkpointed_iteration.txt"
    (ckpt / "global_step_4").mkdir(parents=True)
    os.mkfifo(ckpt / "global_step_4" / "data.pt")
    with open(run / "log.txt", "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "verl.trainer.main_ppo", *args], cwd=run, env=_env(run),
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.time() + 900
        while time.time() < deadline and proc.poll() is None and not (ckpt / "global_step_4" / "actor").exists():
            time.sleep(0.05)
        time.sleep(1.0)  # the driver moves on from the actor's save to the blocked data.pt
        assert proc.poll() is None, "the run ended before it could be killed:\n" + (run / "log.txt").read_text()[-4000:]
        # the driver and every process of its run (its own Ray: GCS, raylet, TaskRunner, workers) at once; a
        # process-group kill would leave Ray's daemons and the TaskRunner training on for a while
        _kill_session(proc.pid)
        proc.wait(timeout=60)
    killed = read_metrics(run)
    assert 4 not in killed
    assert marker.read_text() == "2"  # step 4's checkpoint was cut short: step 2 stays the one to resume from

    # resume (trainer.resume_mode=auto) in the same directory: continues at step 3 over the cut-short step-4 folder
    (ckpt / "global_step_4" / "data.pt").unlink()
    assert (ckpt / "global_step_4" / "actor").is_dir()
    (run / "metrics.jsonl").unlink()
    resumed = run_main(run, args)
    assert sorted(resumed) == [3, 4], sorted(resumed)
    for step in (3, 4):
        a, b = _comparable(full[step]), _comparable(resumed[step])
        assert a.keys() == b.keys()
        diffs = {k: (a[k], b[k]) for k in a if a[k] != b[k]}
        assert not diffs, f"step {step}: resumed run differs: {diffs}"
    assert resumed[3]["training/epoch"] == 1


def test_grpo_continues_a_saved_lora_adapter(assets, tmp_path):
    """verl's lora_from_adapter script: model.lora_adapter_path alone. The adapter's rank and targets become the
    run's LoRA keys, the actor starts from the adapter (not from zero-initialised B), the reference is the
    adapter-free base, and the rollout follows the actor."""
    import torch

    from verl.utils.fsdp_utils import apply_lora
    from verl.utils.model import load_causal_lm

    trained = apply_lora(load_causal_lm(assets["model"]), 8, lora_alpha=16, target_modules=["q_proj", "v_proj"])
    with torch.no_grad():
        for name, p in trained.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.01)
    trained.save_pretrained(str(tmp_path / "adapter"))
    run = tmp_path / "lora_adapter"
    metrics = run_main(run, quickstart_args(assets, steps=1) + [
        "algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.actor.use_kl_loss=True",
        f"actor_rollout_ref.model.lora_adapter_path={tmp_path / 'adapter'}", "trainer.save_freq=-1"])
    log = (run / "log.txt").read_text()
    assert "actor_rollout_ref.model.lora_rank: 0 -> 8  (from the adapter" in log
    m = metrics[1]
    assert m["actor/kl_loss"] > 1e-4  # the actor carries the adapter, the reference is the base without it
    assert m["training/rollout_probs_diff_max"] <= 1e-3 and m["actor/grad_norm"] > 0
