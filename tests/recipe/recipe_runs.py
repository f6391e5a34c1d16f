"""Run a recipe entry point as a subprocess in its own directory and read its `file`-logger metrics."""

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def recipe_env(run_dir: Path) -> dict:
    return dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1", RAY_AUTH_MODE="disabled",
                TOKENIZERS_PARALLELISM="false", VERL_FILE_LOGGER_PATH=str(run_dir / "metrics.jsonl"),
                RAY_DEDUP_LOGS="0", PYTHONUNBUFFERED="1", WANDB_MODE="offline")


def run_recipe(module: str, run_dir: Path, args: list[str], timeout: int = 900, expect_rc: int = 0):
    """``python -m <module> <args>`` in ``run_dir``; returns (metrics by step, log text)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / "log.txt", "w") as log:
        proc = subprocess.run([sys.executable, "-m", module, *args], cwd=run_dir, env=recipe_env(run_dir),
                              stdout=log, stderr=subprocess.STDOUT, timeout=timeout)
    text = (run_dir / "log.txt").read_text()
    assert proc.returncode == expect_rc, text[-6000:]
    return read_metrics(run_dir), text


def read_metrics(run_dir: Path) -> dict[int, dict]:
    steps: dict[int, dict] = {}
    path = run_dir / "metrics.jsonl"
    if path.exists():
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if "data" in record:
                steps.setdefault(record["step"], {}).update(record["data"])
    return steps
