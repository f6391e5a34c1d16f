"""Bad data and paths stop the run before Ray starts (:mod:`verl.trainer.config_schema.preflight`).

Each of these used to surface after the workers had started, or many steps in: a row without a ground truth
(KeyError in the reward function), a model directory without tokenizer files (empty prompts), a checkpoint
directory that is a file (after the first step), a missing prompt column, an unreadable or empty parquet file,
fewer rows than one batch, a data source no scorer knows (at the first validation), a dump directory that is a
file, a misnamed reward function, a resume path without the actor's checkpoint. Unit tests call the checks on
tiny files; the three cases first reported run ``python -m verl.trainer.main_ppo``, which must exit 2 within
seconds, naming the file, row and key, having written nothing and started no Ray (``--check-config`` runs the
same validator: tests/trainer/test_check_config.py).
"""

import os
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hydra import compose, initialize_config_dir
from omegaconf import open_dict

from tests.trainer.validator_assets import add_tokenizer_file
from verl.trainer.config_schema.preflight import check_run_files
from verl.trainer.config_schema.validate import typed_ppo_config
from verl.utils.config import ConfigError
from verl.utils.embedded.arithmetic import make_rl_rows

REPO = Path(__file__).resolve().parents[2]
CONFIG_DIR = str(REPO / "verl" / "trainer" / "config")


def write_rows(path: Path, rows: list[dict]) -> Path:
    pq.write_table(pa.Table.from_pylist(rows), str(path))
    return path


@pytest.fixture(scope="module")
def a(tmp_path_factory):
    root = tmp_path_factory.mktemp("preflight")
    model = root / "model"
    model.mkdir()
    (model / "config.json").write_text('{"num_attention_heads": 4, "num_key_value_heads": 2}')
    add_tokenizer_file(model)
    no_gt = make_rl_rows(16, "train", seed=0)
    for row in no_gt[5:]:
        row["reward_model"] = {"style": "rule"}
    (root / "a_file").write_text("x")
    return {"root": root, "model": model,
            "train": write_rows(root / "train.parquet", make_rl_rows(16, "train", seed=0)),
            "test": write_rows(root / "test.parquet", make_rl_rows(4, "test", seed=1)),
            "no_gt": write_rows(root / "no_gt.parquet", no_gt), "file": root / "a_file"}


def base(a) -> list[str]:
    return [f"data.train_files={a['train']}", f"data.val_files={a['test']}",
            f"actor_rollout_ref.model.path={a['model']}", "actor_rollout_ref.rollout.name=hf",
            "data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2", "algorithm.adv_estimator=grpo",
            "trainer.n_gpus_per_node=2", "trainer.logger=console"]


def check(a, *extra, use_critic=False) -> None:
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        cfg = compose(config_name="ppo_trainer", overrides=base(a) + list(extra))
    check_run_files(cfg, use_critic=use_critic)


def problem(a, *extra, use_critic=False) -> str:
    with pytest.raises(ConfigError) as err:
        check(a, *extra, use_critic=use_critic)
    return str(err.value)


# ------------------------------------------------------------------------------------ the three reported cases

def test_rows_without_ground_truth_are_named_with_file_row_and_field(a, tmp_path):
    msg = problem(a, f"data.train_files={a['no_gt']}")
    assert f"data.train_files: row 5 of {a['no_gt']} has no reward_model.ground_truth" in msg, msg
    assert "custom_reward_function.path" in msg, msg
    no_column = write_rows(tmp_path / "v.parquet", [{k: v for k, v in r.items() if k != "reward_model"}
                                                   for r in make_rl_rows(4, "test", seed=1)])
    assert f"data.val_files: row 0 of {no_column} has no reward_model.ground_truth" in problem(
        a, f"data.val_files={no_column}")
    # what the message offers works: a custom scorer (which gets ground_truth=None), or a reward model
    reward = tmp_path / "reward.py"
    reward.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return 0.0\n")
    check(a, f"data.train_files={a['no_gt']}", f"custom_reward_function.path={reward}")
    check(a, f"data.train_files={a['no_gt']}", "reward_model.enable=True")
    # rows the dataset does not keep (data.train_max_samples, no shuffle) are not judged
    check(a, f"data.train_files={a['no_gt']}", "data.train_max_samples=5", "data.shuffle=False")


def test_model_directory_without_tokenizer_files_is_named_by_its_key(a, tmp_path):
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "config.json").write_text("{}")
    msg = problem(a, f"actor_rollout_ref.model.path={bare}")
    assert msg.startswith(f"actor_rollout_ref.model.path={bare} has no tokenizer: none of tokenizer.json"), msg
    assert "every prompt would be zero tokens" in msg and "actor_rollout_ref.model.tokenizer_path" in msg, msg
    # a separate tokenizer directory is what is read then, and is what the message names
    check(a, f"actor_rollout_ref.model.path={bare}", f"actor_rollout_ref.model.tokenizer_path={a['model']}")
    msg = problem(a, f"actor_rollout_ref.model.tokenizer_path={bare}")
    assert msg.startswith(f"actor_rollout_ref.model.tokenizer_path={bare} has no tokenizer"), msg
    (bare / "vocab.json").write_text("{}")  # a BPE vocabulary loads too
    check(a, f"actor_rollout_ref.model.path={bare}")


def test_checkpoint_and_resume_paths_are_checked_for_type_and_writability(a, tmp_path, monkeypatch):
    msg = problem(a, f"trainer.default_local_dir={a['file']}")
    assert msg.startswith(f"trainer.default_local_dir={a['file']} is a file, not a directory"), msg
    msg = problem(a, f"trainer.default_local_dir={a['file']}/ckpt")
    assert f"cannot be created: {a['file']} is a file" in msg, msg
    check(a, f"trainer.default_local_dir={tmp_path}/new/ckpt")  # created later, by the run
    assert not (tmp_path / "new").exists()
    locked = tmp_path / "locked"
    locked.mkdir()
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if str(p) == str(locked) else real_access(p, mode))
    msg = problem(a, f"trainer.default_local_dir={locked}/ckpt")
    assert f"trainer.default_local_dir={locked}/ckpt: {locked} is not writable" in msg, msg
    monkeypatch.undo()

    resume = ("trainer.resume_mode=resume_path",)
    step = tmp_path / "ckpt" / "global_step_3"
    step.mkdir(parents=True)
    msg = problem(a, *resume, f"trainer.resume_from_path={step}")
    assert f"trainer.resume_from_path={step} holds no actor/ checkpoint" in msg, msg
    (step / "actor").mkdir()
    check(a, *resume, f"trainer.resume_from_path={step}")
    msg = problem(a, *resume, f"trainer.resume_from_path={step}", use_critic=True)
    assert "holds no critic/ checkpoint" in msg, msg
    as_file = tmp_path / "global_step_4"
    as_file.write_text("x")
    msg = problem(a, *resume, f"trainer.resume_from_path={as_file}")
    assert f"trainer.resume_from_path={as_file} is a file, not a checkpoint directory" in msg, msg
    # resume_mode=auto reads trainer.default_local_dir only, as in verl
    check(a, f"trainer.resume_from_path={as_file}")


# ------------------------------------------------------------------------------------------- more cases

def test_missing_prompt_column_is_named(a, tmp_path):
    rows = [{**{k: v for k, v in r.items() if k != "prompt"}, "question": r["prompt"][0]["content"]}
            for r in make_rl_rows(8, "train", seed=0)]
    path = write_rows(tmp_path / "q.parquet", rows)
    msg = problem(a, f"data.train_files={path}")
    assert f"data.train_files: {path} has no column 'prompt' (data.prompt_key)" in msg and "'question'" in msg, msg
    check(a, f"data.train_files={path}", f"data.val_files={path}", "data.prompt_key=question")


def test_unreadable_and_empty_parquet_files_are_named(a, tmp_path):
    corrupt = tmp_path / "corrupt.parquet"
    corrupt.write_text("not a parquet file\n")
    msg = problem(a, f"data.val_files={corrupt}")
    assert f"data.val_files: {corrupt} is not a readable parquet file" in msg, msg
    empty = tmp_path / "empty.parquet"
    pq.write_table(pa.Table.from_pylist(make_rl_rows(2, "test", seed=0)).slice(0, 0), str(empty))
    msg = problem(a, f"data.train_files=[{a['train']},{empty}]")
    assert f"data.train_files: {empty} has no rows" in msg, msg


def test_fewer_training_rows_than_one_batch(a, tmp_path):
    three = write_rows(tmp_path / "three.parquet", make_rl_rows(3, "train", seed=0))
    msg = problem(a, f"data.train_files={three}")
    assert f"data.train_files: 3 training rows in {three}, fewer than data.train_batch_size=4" in msg, msg
    msg = problem(a, "data.train_max_samples=2")
    assert "2 training rows (data.train_max_samples=2)" in msg, msg
    check(a, f"data.train_files=[{three},{three}]")  # the files add up


def test_data_source_without_a_scorer_or_column_is_named(a, tmp_path):
    rows = make_rl_rows(4, "test", seed=1)
    rows[2]["data_source"] = "my_org/my_task"
    path = write_rows(tmp_path / "val.parquet", rows)
    msg = problem(a, f"data.val_files={path}")
    assert f"data.val_files: row 2 of {path} has data_source='my_org/my_task' (data.reward_fn_key)" in msg, msg
    assert "arithmetic" in msg and "custom_reward_function.path" in msg, msg
    no_source = write_rows(tmp_path / "nosrc.parquet", [{k: v for k, v in r.items() if k != "data_source"}
                                                        for r in make_rl_rows(4, "test", seed=1)])
    msg = problem(a, f"data.val_files={no_source}")
    assert f"{no_source} has no column 'data_source' (data.reward_fn_key)" in msg, msg
    # agent-loop data (agent_name) may carry its own reward: not judged here
    write_rows(path, [{**r, "agent_name": "tool_agent"} for r in rows])
    check(a, f"data.val_files={path}")


def test_dump_directories_that_are_files(a):
    for key in ("trainer.rollout_data_dir", "trainer.validation_data_dir"):
        msg = problem(a, f"{key}={a['file']}")
        assert msg.startswith(f"{key}={a['file']} is a file, not a directory"), msg


def test_reward_function_name_not_in_its_file(a, tmp_path):
    reward = tmp_path / "reward.py"
    reward.write_text("import math\n\ndef my_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                      "    return 0.0\n")
    msg = problem(a, f"custom_reward_function.path={reward}")
    assert f"custom_reward_function.name=compute_score is not defined in {reward}" in msg, msg
    assert "defined there: my_score" in msg and "set custom_reward_function.name=my_score" in msg, msg
    check(a, f"custom_reward_function.path={reward}", "custom_reward_function.name=my_score")
    check(a, f"custom_reward_function.path={reward}", "custom_reward_function.name=math")  # imports count
    reward.write_text("def compute_score(:\n")
    assert "cannot be loaded: invalid syntax" in problem(a, f"custom_reward_function.path={reward}")
    reward.write_text("from my_scorers import *\n")  # names a reading cannot see: left to the import
    check(a, f"custom_reward_function.path={reward}")


def test_a_key_the_config_leaves_out_has_the_schema_default(a):
    """The checks read the config's typed view: without data.shuffle the schema's default (shuffle) picks the rows
    data.train_max_samples keeps, as the dataset will; the view the validator built is read as passed."""
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        cfg = compose(config_name="ppo_trainer", overrides=base(a) + [
            f"data.train_files={a['no_gt']}", "data.train_max_samples=5", "data.shuffle=False"])
    as_composed = typed_ppo_config(cfg)
    check_run_files(cfg, use_critic=False)  # the first 5 rows, all with a ground truth
    with open_dict(cfg):
        del cfg.data["shuffle"]
    with pytest.raises(ConfigError, match=r"data.train_files: row \d+ of .* has no reward_model.ground_truth"):
        check_run_files(cfg, use_critic=False)
    check_run_files(cfg, use_critic=False, typed=as_composed)


# ------------------------------------------------------------------------------ end to end, before Ray starts

def main_ppo(a, tmp_path, *extra, check_only=False):
    """Run the entry point in an empty directory; returns (exit code, output, seconds). Asserts that nothing was
    written there, under the checkpoint directory or in Ray's temp directory."""
    run = tmp_path / "run"
    run.mkdir()
    ray_tmp = tmp_path / "ray"
    env = dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1", RAY_AUTH_MODE="disabled", RAY_TMPDIR=str(ray_tmp))
    env.pop("RAY_ADDRESS", None)
    ckpt = [] if any(e.startswith("trainer.default_local_dir=") for e in extra) else \
        [f"trainer.default_local_dir={tmp_path / 'ckpt'}"]
    args = [*base(a), *ckpt, *extra]
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "verl.trainer.main_ppo", *(["--check-config"] if check_only else []),
                           *args], cwd=run, env=env, capture_output=True, text=True, timeout=120)
    elapsed = time.monotonic() - start
    assert not any(run.iterdir()) and not (tmp_path / "ckpt").exists() and not ray_tmp.exists()
    return proc.returncode, proc.stdout + proc.stderr, elapsed


@pytest.mark.parametrize("case", ["ground_truth", "tokenizer", "checkpoint_dir"])
def test_main_ppo_stops_before_ray_naming_the_problem(a, tmp_path, case):
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "config.json").write_text('{"num_attention_heads": 4, "num_key_value_heads": 2}')
    extra, expected = {
        "ground_truth": (f"data.train_files={a['no_gt']}",
                         f"data.train_files: row 5 of {a['no_gt']} has no reward_model.ground_truth"),
        "tokenizer": (f"actor_rollout_ref.model.path={bare}", f"actor_rollout_ref.model.path={bare} has no tokenizer"),
        "checkpoint_dir": (f"trainer.default_local_dir={a['file']}",
                           f"trainer.default_local_dir={a['file']} is a file, not a directory"),
    }[case]
    rc, out, elapsed = main_ppo(a, tmp_path, extra)
    assert rc == 2 and f"Config error: {expected}" in out, out[-3000:]
    assert "Traceback" not in out and elapsed < 20, (elapsed, out[-3000:])

