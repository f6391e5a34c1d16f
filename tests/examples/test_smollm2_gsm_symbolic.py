"""examples/grpo_trainer/run_smollm2_gsm_symbolic.sh: its GRPO / PPO / LoRA command lines pass main_ppo's config
validation (checked in-process, fast), and -- e2e, slow -- a GRPO step on the real SmolLM2-135M-Instruct with
short responses and a held-out validation, from the prepared model and freshly made data, without a hub."""

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from verl.trainer.config_schema.validate import validate_ppo_config

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "examples" / "grpo_trainer" / "run_smollm2_gsm_symbolic.sh"
RECORDER = """#!/usr/bin/env bash
# stands in for python: records a main_ppo command line, runs anything else with the real interpreter
if [ "$1" = "-m" ] && [ "$2" = "verl.trainer.main_ppo" ]; then shift 2; printf '%s\\n' "$@" > "$ARGS_OUT"; exit 0; fi
exec {python} "$@"
"""


def script_overrides(tmp_path, model_dir, script=SCRIPT, **env_extra):
    """The overrides the script passes to main_ppo (python replaced by a recorder)."""
    fake = tmp_path / "fakepy"
    fake.write_text(RECORDER.format(python=shlex.quote(sys.executable)))
    fake.chmod(0o755)
    args = tmp_path / "args.txt"
    env = dict(os.environ, PY=str(fake), ARGS_OUT=str(args), MODEL_DIR=str(model_dir),
               DATA_DIR=str(tmp_path / "data"), HF_HUB_OFFLINE="1", **env_extra)
    proc = subprocess.run(["bash", str(script), "trainer.total_training_steps=3"], env=env, capture_output=True,
                          text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout, args.read_text().splitlines()


@pytest.fixture(scope="module")
def fake_model(tmp_path_factory):
    """A model directory the script accepts as prepared (the config check only needs it to exist)."""
    from verl.utils.embedded import make_model_dir

    return Path(make_model_dir(str(tmp_path_factory.mktemp("m") / "model"), size="tiny"))


@pytest.mark.parametrize("variant", [{}, {"ALGO": "ppo"}, {"LORA_RANK": "8"}])
def test_script_command_lines_validate(tmp_path, fake_model, variant):
    stdout, overrides = script_overrides(tmp_path, fake_model, **variant)
    assert (tmp_path / "data" / "train.parquet").exists() and (tmp_path / "data" / "test.parquet").exists()
    assert "precision=fp32" in stdout or "precision=bf16" in stdout
    with initialize_config_dir(config_dir=str(REPO / "verl" / "trainer" / "config"), version_base=None):
        cfg = compose(config_name="ppo_trainer", overrides=overrides)
    plan = validate_ppo_config(cfg)
    assert cfg.trainer.total_training_steps == 3  # the caller's override wins
    assert cfg.data.val_files.endswith("test.parquet") and cfg.trainer.val_before_train
    assert cfg.custom_reward_function.name == "compute_score_strict_and_flexible"
    assert plan.use_critic == (variant.get("ALGO") == "ppo")
    assert cfg.actor_rollout_ref.model.lora_rank == int(variant.get("LORA_RANK", 0))
    dtype = "bf16" if "precision=bf16" in stdout else "fp32"
    assert cfg.actor_rollout_ref.actor.fsdp_config.dtype == dtype


def test_two_hour_script_runs_grpo_from_the_warm_start(tmp_path, fake_model):
    """run_smollm2_arith_2h.sh: basic_arithmetic data, then (warm start already written here) GRPO from the SFT
    model with the documented settings; the command line passes main_ppo's validation."""
    sft_model = tmp_path / "w-sft" / "global_step_2" / "huggingface"
    sft_model.parent.mkdir(parents=True)
    sft_model.symlink_to(fake_model, target_is_directory=True)
    stdout, overrides = script_overrides(tmp_path, fake_model, script=SCRIPT.with_name("run_smollm2_arith_2h.sh"),
                                         WORK=str(tmp_path / "w"), SFT_STEPS="2")
    assert (tmp_path / "data" / "test.parquet").exists()
    with initialize_config_dir(config_dir=str(REPO / "verl" / "trainer" / "config"), version_base=None):
        cfg = compose(config_name="ppo_trainer", overrides=overrides)
    validate_ppo_config(cfg)
    assert cfg.actor_rollout_ref.model.path == str(sft_model)
    assert cfg.trainer.total_training_steps == 3  # the caller's override wins over GRPO_STEPS
    assert cfg.data.train_batch_size == 16 and cfg.actor_rollout_ref.rollout.n == 8
    assert cfg.actor_rollout_ref.actor.optim.lr == 1e-5 and cfg.data.max_response_length == 64
    assert cfg.trainer.test_freq == 10 and cfg.trainer.val_before_train
    assert cfg.trainer.default_local_dir == str(tmp_path / "w-grpo")


def test_script_refuses_unknown_algo(tmp_path, fake_model):
    proc = subprocess.run(["bash", str(SCRIPT)], env=dict(os.environ, ALGO="dpo", MODEL_DIR=str(fake_model),
                                                          DATA_DIR=str(tmp_path / "d")),
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 2 and "ALGO must be grpo or ppo" in proc.stderr


@pytest.mark.e2e
@pytest.mark.timeout(3600)
def test_run_script_few_steps(smollm2_dir, tmp_path):
    log = tmp_path / "metrics.jsonl"
    env = dict(os.environ, PY=sys.executable, MODEL_DIR=str(smollm2_dir), DATA_DIR=str(tmp_path / "data"),
               ROLLOUT="hf", CKPT_DIR=str(tmp_path / "ckpt"), VERL_FILE_LOGGER_PATH=str(log), HF_HUB_OFFLINE="1",
               RAY_AUTH_MODE="disabled")
    proc = subprocess.run(
        ["bash", str(SCRIPT), "trainer.total_training_steps=1", "data.train_batch_size=4",
         "actor_rollout_ref.actor.ppo_mini_batch_size=4", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
         "actor_rollout_ref.rollout.n=2", "data.max_response_length=16", "data.val_max_samples=4",
         "trainer.val_before_train=False", "trainer.test_freq=1", "trainer.logger=[console,file]"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=3500)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    records = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    steps = [r for r in records if "actor/pg_loss" in r.get("data", r)]
    assert len(steps) == 1, records
    metrics = {k: v for r in records for k, v in r.get("data", r).items()}
    assert "val-core/openai/gsm8k/acc/mean@1" in metrics, sorted(metrics)
    assert "val-aux/openai/gsm8k/acc_flexible/mean@1" in metrics
    assert 0 < metrics["response_length/mean"] <= 16


SFT_SCRIPT = REPO / "examples" / "sft" / "run_smollm2_gsm_symbolic_sft.sh"


def test_sft_warm_start_script_trains_and_writes_a_model(tmp_path, fake_model):
    """The warm-start script end to end on the tiny model (the real SmolLM2 run is documented, not tested): it
    makes the data, trains on extra_info.answer with the host's precision, and writes the HF model the GRPO
    script takes as MODEL_DIR. An old data directory without extra_info.answer is refused by name."""
    data = tmp_path / "data"
    subprocess.run([sys.executable, str(REPO / "examples" / "data_preprocess" / "gsm_symbolic.py"),
                    "--local_save_dir", str(data), "--train_size", "16", "--test_size", "4"], check=True,
                   capture_output=True, timeout=300)
    env = dict(os.environ, BASE_MODEL=str(fake_model), DATA_DIR=str(data), SFT_DIR=str(tmp_path / "sft"), STEPS="2",
               HF_HUB_OFFLINE="1")
    proc = subprocess.run(["bash", str(SFT_SCRIPT), "data.train_batch_size=8", "data.micro_batch_size_per_gpu=8",
                           "trainer.test_freq=2"], env=env, capture_output=True, text=True,
                          timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    losses = [line for line in proc.stdout.splitlines() if line.startswith("step:2 ")]
    assert losses and "val/loss" in losses[0], proc.stdout[-2000:]
    assert (tmp_path / "sft" / "global_step_2" / "huggingface" / "model.safetensors").exists()

    import pyarrow.parquet as pq

    old = tmp_path / "old"
    old.mkdir()
    for split in ("train", "test"):
        table = pq.read_table(data / f"{split}.parquet").to_pylist()
        for row in table:
            row["extra_info"] = {k: v for k, v in row["extra_info"].items() if k != "answer"}
        import pandas as pd

        pd.DataFrame(table).to_parquet(old / f"{split}.parquet")
    env["DATA_DIR"] = str(old)
    proc = subprocess.run(["bash", str(SFT_SCRIPT)], env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 2 and "no extra_info.answer" in proc.stderr
