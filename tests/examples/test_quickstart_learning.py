"""The quickstart driver end to end in --fast mode (tiny sizes; checks the plumbing and what a new user sees,
not learning): every stage runs, the summary and plot are written, progress lines appear at least every
10 seconds while GRPO runs, and no output line -- of the quickstart or of the GRPO log -- repeats more than 3
times (the vLLM weight-reload warning and the config dump used to flood it)."""

import collections
import importlib.util
import json
import os
import re
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
STAMP = re.compile(r"^\[quickstart (\d\d:\d\d:\d\d)\] (.*)$")
ROLLOUT = "vllm" if importlib.util.find_spec("vllm") is not None else "hf"
GRPO_STEPS = 5  # more weight pushes than the repeat limit, so a per-push message would show


RAY_PREFIX = re.compile(r"^(\x1b\[\d+m)?\([A-Za-z_]+ pid=\d+\)(\x1b\[0m)?\s?")


def repeated_lines(lines, limit=3):
    """Lines (without Ray's "(Actor pid=N)" prefix) that occur more than ``limit`` times; blank ones don't count
    (tqdm's carriage returns inside a Ray actor come out as prefixed empty lines)."""
    bodies = [RAY_PREFIX.sub("", line).rstrip() for line in lines]
    counts = collections.Counter(body for body in bodies if body.strip())
    return {line: n for line, n in counts.items() if n > limit}


def grpo_progress(stdout: str):
    """(seconds since the previous quickstart line, text) for each status line printed while GRPO ran."""
    stamped = [(datetime.strptime(m.group(1), "%H:%M:%S"), m.group(2))
               for m in map(STAMP.match, stdout.splitlines()) if m]
    start = next(i for i, (_, text) in enumerate(stamped) if text.startswith("grpo: ") and "(log:" in text)
    end = next(i for i, (_, text) in enumerate(stamped) if text.startswith("grpo: done in"))
    return [((t - stamped[i - 1][0]).seconds, text) for i, (t, text) in enumerate(stamped[start + 1:end + 1], start + 1)]


def test_repeat_and_progress_checks_catch_what_they_should():
    assert repeated_lines(["a", "b", "a", "a", "a", "", "", "", ""]) == {"a": 4}
    out = ("[quickstart 10:00:00] grpo: python -m ... (log: x)\n[quickstart 10:00:05] grpo: starting, 5s so far\n"
           "[quickstart 10:00:17] grpo: step 1/2 | score 0.1\n[quickstart 10:00:18] grpo: done in 18s\n")
    assert [gap for gap, _ in grpo_progress(out)] == [5, 12, 1]


@pytest.mark.e2e
def test_quickstart_fast_runs_all_stages(tmp_path):
    out = tmp_path / "qs"
    env = dict(os.environ, HF_HUB_OFFLINE="1", RAY_AUTH_MODE="disabled")
    proc = subprocess.run([sys.executable, str(REPO / "examples" / "quickstart" / "run_quickstart.py"), "--fast",
                           "--grpo_steps", str(GRPO_STEPS), "--rollout", ROLLOUT, "--out", str(out)], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rollout"] == ROLLOUT
    assert 0.0 <= summary["first_step_score"] <= 1.0 and 0.0 <= summary["last_step_score"] <= 1.0
    assert 0.0 <= summary["val_after_sft"] <= 1.0 and 0.0 <= summary["val_after_grpo"] <= 1.0
    assert (out / "training_curves.png").stat().st_size > 1000
    assert (out / "sft" / "global_step_4" / "huggingface" / "model.safetensors").exists()
    assert "greedy validation accuracy: after SFT" in proc.stdout
    assert "mean score: first step" in proc.stdout
    assert f"training curves: {out / 'training_curves.png'}" in proc.stdout

    # what the user reads: progress while GRPO runs, at most 10 s apart, with the score once steps are done
    progress = grpo_progress(proc.stdout)
    assert max(gap for gap, _ in progress) <= 10, progress
    assert any(re.search(r"grpo: step \d+/5\b[^|]*\| score [\d.]+", text) for _, text in progress), progress
    # the short summary table: one row per validation (step 0 = the SFT model, then steps 2, 4, 5)
    assert re.search(r"0 \(SFT model\) \|\s+\|\s+[\d.]+\n\s+1-2 \|\s+[\d.]+ \|\s+[\d.]+\n", proc.stdout), proc.stdout

    # no flood: neither the quickstart's output nor the GRPO stage's full log repeats a line more than 3 times
    grpo_log = (out / "logs" / "grpo.log").read_text().splitlines()
    assert not repeated_lines(proc.stdout.splitlines() + proc.stderr.splitlines())
    assert not repeated_lines(grpo_log), repeated_lines(grpo_log)
    assert not any("Failed to load weights" in line for line in grpo_log)
    # the config: one summary line instead of the ~400-line dump
    assert sum("Config: algorithm.adv_estimator=grpo" in line for line in grpo_log) == 1
    assert not any("'actor_rollout_ref': {" in line for line in grpo_log)
