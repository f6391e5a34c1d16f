"""The offline tracking backends beyond console/file/tensorboard/wandb (tests/utils/test_tracking.py): MLflow
with a local SQLite store and SwanLab in offline mode, each writing to a temp dir and read back with the
backend's own reader; every installed backend at once, as ``trainer.logger=[...]`` would build them; and the
ClearML and Trackio adapters against stand-ins of their packages (neither package is installed here)."""

import glob
import json
import os
import shutil

import pytest

from verl.utils.tracking import (SUPPORTED_BACKENDS, Tracking, ValidationGenerationsLogger, flatten_config,
                                 missing_backend_package, mlflow_metric_name)

CONFIG = {"trainer": {"project_name": "proj", "logger": ["console"]}, "actor": {"optim": {"lr": 1e-3}}}


def test_flatten_and_mlflow_names():
    assert flatten_config(CONFIG) == {"trainer.project_name": "proj", "trainer.logger": "['console']",
                                      "actor.optim.lr": "0.001"}
    assert mlflow_metric_name("val-core/arithmetic/reward/mean@1") == "val-core/arithmetic/reward/mean_at_1"
    assert mlflow_metric_name("a(b)/c d:e.f-g") == "a_b_/c d:e.f-g"


@pytest.fixture(scope="module")
def empty_mlflow_db(tmp_path_factory):
    """An MLflow SQLite store with its tables created (the schema migration takes ~10 s; done once here)."""
    mlflow = pytest.importorskip("mlflow")
    path = tmp_path_factory.mktemp("mlflow_template") / "mlflow.db"
    mlflow.MlflowClient(f"sqlite:///{path}").search_experiments()
    return path


@pytest.fixture
def in_tmp(tmp_path, monkeypatch, empty_mlflow_db):
    """cwd = a fresh temp dir holding an empty ./mlflow.db (where the mlflow backend writes by default)."""
    monkeypatch.chdir(tmp_path)
    for var in ("MLFLOW_TRACKING_URI", "SWANLAB_MODE", "SWANLAB_API_KEY", "SWANLAB_LOG_DIR"):
        monkeypatch.delenv(var, raising=False)
    shutil.copy(empty_mlflow_db, tmp_path / "mlflow.db")
    return tmp_path


def test_mlflow_local_sqlite_store(in_tmp):
    mlflow = pytest.importorskip("mlflow")
    tracker = Tracking("proj", "exp", default_backend=["mlflow"], config=CONFIG)
    run_id = tracker.logger["mlflow"].run.info.run_id
    tracker.log({"critic/score/mean": 0.25, "val-core/arithmetic/reward/mean@1": 0.5, "note": "text"}, step=1)
    tracker.log({"critic/score/mean": 0.75}, step=2)
    ValidationGenerationsLogger().log(["mlflow"], [("1+2=", "3", 1.0)], step=2, tracker=tracker)
    tracker.finish()

    client = mlflow.MlflowClient(f"sqlite:///{in_tmp / 'mlflow.db'}")  # the default store: ./mlflow.db
    run = client.get_run(run_id)
    assert run.info.run_name == "exp" and client.get_experiment(run.info.experiment_id).name == "proj"
    assert run.data.params["actor.optim.lr"] == "0.001"
    history = client.get_metric_history(run_id, "critic/score/mean")
    assert [(m.step, m.value) for m in history] == [(1, 0.25), (2, 0.75)]
    assert run.data.metrics["val-core/arithmetic/reward/mean_at_1"] == 0.5
    assert "note" not in run.data.metrics
    artifact = client.download_artifacts(run_id, "val_generations/step_2.json", str(in_tmp / "dl"))
    assert json.load(open(artifact)) == {"step": 2, "samples": [{"input": "1+2=", "output": "3", "score": 1.0}]}


def mlflow_runs(db):
    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{db}")
    return client.search_runs([e.experiment_id for e in client.search_experiments()])


def _swanlab_scalars(run_file: str) -> dict[str, list[tuple[int, float]]]:
    """{metric: [(step, value)]} from a SwanLab run file, read with SwanLab's own record reader."""
    from swanlab.proto.swanlab.record.v1 import record_pb2
    from swanlab.sdk.internal.core_python.store import DataStoreReader

    reader, out = DataStoreReader(), {}
    reader.open(run_file)
    for raw in reader:
        record = record_pb2.Record()
        record.ParseFromString(raw)
        if record.HasField("scalar"):
            out.setdefault(record.scalar.key, []).append((record.scalar.step, record.scalar.value.number))
    reader.close()
    return out


def test_swanlab_offline_without_credentials(in_tmp, capsys):
    pytest.importorskip("swanlab")
    tracker = Tracking("proj", "exp", default_backend=["swanlab"], config=CONFIG)
    tracker.log({"critic/score/mean": 0.25, "val-core/arithmetic/reward/mean@1": 0.5, "note": "text"}, step=1)
    tracker.log({"critic/score/mean": 0.75}, step=2)
    tracker.finish()
    assert "logging offline under ./swanlog" in capsys.readouterr().out
    (run_file,) = glob.glob(str(in_tmp / "swanlog" / "run-*" / "run-*.swanlab"))
    scalars = _swanlab_scalars(run_file)
    assert scalars["critic/score/mean"] == [(1, 0.25), (2, 0.75)]
    assert scalars["val-core/arithmetic/reward/mean@1"] == [(1, 0.5)]
    assert "note" not in scalars
    (config_file,) = glob.glob(str(in_tmp / "swanlog" / "run-*" / "files" / "config.yaml"))
    assert "project_name" in open(config_file).read()


def test_all_backends_at_once(in_tmp, monkeypatch, capsys):
    for name in ("mlflow", "swanlab", "wandb", "tensorboard"):
        pytest.importorskip("torch.utils.tensorboard" if name == "tensorboard" else name)
    import wandb

    wandb.teardown()  # wandb keeps its settings (WANDB_DIR) process-wide: forget an earlier test's
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(in_tmp))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("TENSORBOARD_DIR", str(in_tmp / "tb"))
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(in_tmp / "metrics.jsonl"))
    installed = [b for b in SUPPORTED_BACKENDS if missing_backend_package(b) is None]  # clearml, trackio: below
    tracker = Tracking("proj", "exp", default_backend=installed, config=CONFIG)
    assert list(tracker.logger) == installed
    tracker.log({"critic/score/mean": 0.5}, step=3)
    tracker.finish()
    wandb.teardown()  # ... and this test's temp dir
    assert "step:3 - critic/score/mean:0.5" in capsys.readouterr().out
    assert json.loads((in_tmp / "metrics.jsonl").read_text().splitlines()[0]) == {"step": 3, "data": {"critic/score/mean": 0.5}}
    assert glob.glob(str(in_tmp / "tb" / "events.out.tfevents.*"))
    assert glob.glob(str(in_tmp / "wandb" / "offline-run-*"))
    runs = mlflow_runs(in_tmp / "mlflow.db")
    assert [(r.info.run_name, r.data.metrics) for r in runs] == [("exp", {"critic/score/mean": 0.5})]
    assert glob.glob(str(in_tmp / "swanlog" / "run-*" / "run-*.swanlab"))
    assert os.path.getsize(glob.glob(str(in_tmp / "swanlog" / "run-*" / "run-*.swanlab"))[0]) > 0


class _Recorder:
    """A stand-in module: every attribute is another recorder, every call is recorded and returns a recorder."""

    def __init__(self, name, calls):
        self._name, self._calls = name, calls

    def __getattr__(self, attr):
        return _Recorder(f"{self._name}.{attr}", self._calls)

    def __call__(self, *args, **kwargs):
        self._calls.append((self._name, args, kwargs))
        return _Recorder(f"{self._name}()", self._calls)


def test_trackio_adapter(monkeypatch):
    import sys

    calls = []
    monkeypatch.setitem(sys.modules, "trackio", _Recorder("trackio", calls))
    tracker = Tracking("proj", "exp", default_backend=["trackio"], config=CONFIG)
    tracker.log({"critic/score/mean": 0.5, "note": "text"}, step=3)
    tracker.finish()
    assert calls == [("trackio.init", (), {"project": "proj", "name": "exp", "config": CONFIG}),
                     ("trackio.log", ({"critic/score/mean": 0.5},), {"step": 3}),
                     ("trackio.finish", (), {})]


@pytest.mark.parametrize("configured", [False, True])
def test_clearml_adapter(monkeypatch, tmp_path, configured):
    import sys

    calls = []
    monkeypatch.setitem(sys.modules, "clearml", _Recorder("clearml", calls))
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/clearml.conf
    for var in ("CLEARML_API_HOST", "CLEARML_CONFIG_FILE", "CLEARML_OFFLINE_MODE"):
        monkeypatch.delenv(var, raising=False)
    if configured:
        monkeypatch.setenv("CLEARML_API_HOST", "http://clearml.example:8008")
    tracker = Tracking("proj", "exp", default_backend=["clearml"], config=CONFIG)
    tracker.log({"critic/score/mean": 0.5, "val-core/arithmetic/reward/mean@1": 1.0, "loss": 2}, step=3)
    tracker.finish()
    names = [c[0] for c in calls]
    assert ("clearml.Task.set_offline" in names) == (not configured)  # no server configured: offline, no prompt
    assert ("clearml.Task.init", (), {"project_name": "proj", "task_name": "exp", "continue_last_task": True,
                                      "output_uri": False}) in calls
    scalars = [c[2] for c in calls if c[0].endswith("report_scalar")]
    assert scalars == [{"title": "critic", "series": "score/mean", "value": 0.5, "iteration": 3},
                       {"title": "val-core", "series": "arithmetic/reward/mean@1", "value": 1.0, "iteration": 3},
                       {"title": "loss", "series": "loss", "value": 2, "iteration": 3}]
    assert names[-1] == "clearml.Task.init().close"
