"""The least the config validator's file checks accept, for tests that validate configs without running them:
a parquet file of arithmetic rows in verl's RL schema and a tokenizer file in a model directory (the validator
reads the data's columns and looks for tokenizer files; nothing loads the model or the tokenizer)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROWS = 64  # more than any data.train_batch_size these tests set


def write_rl_parquet(path: Path, rows: int = ROWS) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from verl.utils.embedded.arithmetic import make_rl_rows

    pq.write_table(pa.Table.from_pylist(make_rl_rows(rows, "train", seed=0)), str(path))
    return path


def add_tokenizer_file(model_dir: Path) -> Path:
    (model_dir / "tokenizer.json").write_text("{}")
    return model_dir


def write_validator_assets(root: Path, model_config: str = "{}") -> Path:
    """``root/train.parquet`` and ``root/model`` (a ``config.json`` holding ``model_config`` and a tokenizer file):
    what a validated config's data and model paths point at. Returns ``root``."""
    write_rl_parquet(root / "train.parquet")
    (root / "model").mkdir()
    (root / "model" / "config.json").write_text(model_config)
    add_tokenizer_file(root / "model")
    return root


def run_check_config(run_dir: Path, args: list[str]) -> tuple[int, str]:
    """``python -m verl.trainer.main_ppo --check-config <args>`` in ``run_dir`` as a user runs it, outside the
    test session's Ray cluster: (exit code, stdout + stderr)."""
    repo = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=str(repo), HF_HUB_OFFLINE="1", RAY_AUTH_MODE="disabled")
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.run([sys.executable, "-m", "verl.trainer.main_ppo", "--check-config", *args], cwd=run_dir,
                          env=env, capture_output=True, text=True, timeout=300)
    return proc.returncode, proc.stdout + proc.stderr
