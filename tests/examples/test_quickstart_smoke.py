"""The quickstart driver end to end in --fast mode (tiny sizes; checks the plumbing, not learning)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.e2e
def test_quickstart_fast_runs_all_stages(tmp_path):
    out = tmp_path / "qs"
    env = dict(os.environ, HF_HUB_OFFLINE="1", RAY_AUTH_MODE="disabled")
    proc = subprocess.run([sys.executable, str(REPO / "examples" / "quickstart" / "run_quickstart.py"), "--fast",
                           "--rollout", "hf", "--out", str(out)], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rollout"] == "hf"
    assert 0.0 <= summary["first_step_score"] <= 1.0 and 0.0 <= summary["last_step_score"] <= 1.0
    assert 0.0 <= summary["val_after_sft"] <= 1.0 and 0.0 <= summary["val_after_grpo"] <= 1.0
    assert (out / "grpo" / "ckpt" / "training_curves.png").stat().st_size > 1000
    assert (out / "sft" / "global_step_4" / "huggingface" / "model.safetensors").exists()
    assert "greedy validation accuracy: after SFT" in proc.stdout
    assert "mean score: first step" in proc.stdout
