"""Tracking backends: console line format, JSONL file, tensorboard event file, unknown backend; plot; timer."""

import json
import os

import pytest

from verl.utils.tracking import Tracking, concat_dict_to_str


def test_console_line_format(capsys):
    tracker = Tracking("proj", "exp", default_backend="console")
    tracker.log({"critic/score/mean": 0.5, "actor/pg_loss": -1.25, "note": "skip me", "training/global_step": 3}, step=3)
    tracker.finish()
    out = capsys.readouterr().out.strip()
    assert out == "step:3 - critic/score/mean:0.5 - actor/pg_loss:-1.25 - training/global_step:3"


def test_concat_handles_numpy_and_torch():
    import numpy as np
    import torch

    line = concat_dict_to_str({"a": np.float32(2.0), "b": torch.tensor(1.5)}, step=1)
    assert line == "step:1 - a:2.0 - b:1.5"


def test_file_backend_writes_jsonl_incrementally(tmp_path, monkeypatch):
    path = tmp_path / "sub" / "metrics.jsonl"
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(path))
    tracker = Tracking("proj", "exp", default_backend=["file"])
    tracker.log({"x": 1.0}, step=1)
    # readable before finish(): written as it goes
    assert [json.loads(ln) for ln in path.read_text().splitlines()] == [{"step": 1, "data": {"x": 1.0}}]
    tracker.log({"x": 2.0, "y": 3}, step=2)
    tracker.finish()
    rows = [json.loads(ln) for ln in path.read_text().splitlines()]
    assert rows[-1] == {"step": 2, "data": {"x": 2.0, "y": 3}}


def test_file_backend_default_path(tmp_path, monkeypatch):
    monkeypatch.delenv("VERL_FILE_LOGGER_PATH", raising=False)
    monkeypatch.setenv("VERL_FILE_LOGGER_ROOT", str(tmp_path))
    tracker = Tracking("proj", "exp", default_backend=["file"])
    tracker.log({"x": 1}, step=1)
    tracker.finish()
    assert (tmp_path / "proj" / "exp.jsonl").exists()


def test_tensorboard_event_file(tmp_path, monkeypatch):
    monkeypatch.setenv("TENSORBOARD_DIR", str(tmp_path / "tb"))
    tracker = Tracking("proj", "exp", default_backend=["tensorboard"])
    tracker.log({"critic/score/mean": 0.25}, step=1)
    tracker.finish()
    events = [f for f in os.listdir(tmp_path / "tb") if f.startswith("events.out.tfevents")]
    assert events and os.path.getsize(tmp_path / "tb" / events[0]) > 0

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    assert [e.value for e in acc.Scalars("critic/score/mean")] == [0.25]


def test_wandb_offline(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    tracker = Tracking("proj", "exp", default_backend=["wandb"], config={"a": 1})
    tracker.log({"x": 1.0}, step=1)
    tracker.finish()
    assert any(p.name.startswith("offline-run") for p in (tmp_path / "wandb").iterdir())


def test_wandb_without_credentials_goes_offline(tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb")
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc
    seen = {}
    monkeypatch.setattr(wandb, "init", lambda **kw: seen.update(kw) or object())
    Tracking("proj", "exp", default_backend=["wandb"], config={"a": 1})
    assert seen["mode"] == "offline" and seen["project"] == "proj" and seen["name"] == "exp"
    seen.clear()
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)  # credentials: wandb decides (online)
    Tracking("proj", "exp", default_backend=["wandb"])
    assert "mode" not in seen


def test_unknown_backend_is_a_clear_error():
    with pytest.raises(ValueError, match=r"'mlflw' is not supported; choose from: console, file, tensorboard, wandb"):
        Tracking("proj", "exp", default_backend=["console", "mlflw"])


def test_plot_written(tmp_path):
    from verl.utils.plotting import plot_training_curves

    history = [(s, {"critic/score/mean": s / 10, "response_length/mean": 5.0 + s, "actor/kl_loss": 0.01 * s,
                    "actor/entropy": 2.0 - 0.1 * s}) for s in range(1, 5)]
    path = plot_training_curves(history, str(tmp_path / "exp" / "training_curves.png"))
    assert path and os.path.getsize(path) > 1000
    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert plot_training_curves([], str(tmp_path / "none.png")) is None


def test_marked_timer_accumulates():
    import time

    from verl.utils.timer import _timer, marked_timer

    timing = {}
    with marked_timer("gen", timing, color="red"):
        time.sleep(0.01)
    with _timer("gen", timing):
        time.sleep(0.01)
    assert timing["gen"] >= 0.02 and set(timing) == {"gen"}
