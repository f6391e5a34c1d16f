"""Experiment tracking: one ``Tracking`` object fans each step's metrics out to the chosen backends.

    tracker = Tracking(project_name, experiment_name, default_backend=["console", "file"], config=cfg_dict)
    tracker.log({"critic/score/mean": 0.5}, step=3)
    tracker.finish()

Backends (``trainer.logger``):
- ``console``: verl's line ``step:3 - critic/score/mean:0.5 - ...`` (numbers only) on stdout.
- ``file``: one JSON object per step, ``{"step": 3, "data": {...}}``, appended and flushed as it goes, at
  ``$VERL_FILE_LOGGER_PATH`` if set, else ``$VERL_FILE_LOGGER_ROOT/<project>/<experiment>.jsonl``
  (``VERL_FILE_LOGGER_ROOT`` defaults to the current directory).
- ``tensorboard``: scalars under ``$TENSORBOARD_DIR`` if set, else ``tensorboard_log/<project>/<experiment>``.
- ``wandb``: ``wandb.init(project, name, config)``; set ``WANDB_MODE=offline`` to run without a network
  (without WANDB_MODE and without credentials it logs offline by itself instead of failing).
- ``mlflow``: the project is the MLflow experiment, the experiment name the run name, the flattened config the
  run's parameters. Tracking store: ``$MLFLOW_TRACKING_URI`` if set, else a local SQLite file
  ``./mlflow.db`` (artifacts under ``./mlruns``); view it with ``mlflow ui --backend-store-uri sqlite:///mlflow.db``.
  Metric names are made MLflow-safe (``@`` becomes ``_at_``, other disallowed characters ``_``). ``mlflow-skinny``
  is enough (``pip install verl[mlflow]``: mlflow-skinny, plus sqlalchemy and alembic for the SQLite store);
  rollout traces (``actor_rollout_ref.rollout.trace.backend=mlflow``) go to the same store and experiment.
- ``swanlab``: ``swanlab.init(project, experiment_name, config, logdir=$SWANLAB_LOG_DIR or ./swanlog,
  mode=$SWANLAB_MODE)``; with ``SWANLAB_API_KEY`` set it logs in first. Without a mode and without a key it
  runs ``offline`` (a run file to ``swanlab sync`` later) instead of asking for credentials.
- ``clearml``: a ClearML task (project / experiment name, the config as its "Hyperparameters"); a metric
  ``actor/pg_loss`` is the scalar series ``pg_loss`` of the plot ``actor``. Without a ClearML server configured
  (``CLEARML_API_HOST`` or a ``clearml.conf``) the task runs in ClearML's offline mode (a zip to import later).
- ``trackio``: ``trackio.init(project, name, config)`` (local by default; ``trackio show`` opens the dashboard).
The tracker packages (tensorboard, wandb, mlflow, swanlab, clearml, trackio) are optional: the driver refuses a
backend whose package is not installed before anything starts (:func:`missing_backend_package`). Any other name
fails at construction with the list of supported backends.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import json
import numbers
import os
import pprint
import re
import tempfile
from typing import Any

from omegaconf import OmegaConf

from verl.utils.config import ConfigError

__all__ = ["Tracking", "ValidationGenerationsLogger", "concat_dict_to_str", "SUPPORTED_BACKENDS",
           "missing_backend_package", "check_backend_packages", "mlflow_tracking_uri", "missing_mlflow_packages",
           "mlflow_store_lock"]

SUPPORTED_BACKENDS = ("console", "file", "tensorboard", "wandb", "mlflow", "swanlab", "clearml", "trackio")
# backend -> (module it imports, pip package that provides it); mlflow: see missing_mlflow_packages
BACKEND_PACKAGES = {"tensorboard": ("tensorboard", "tensorboard"), "wandb": ("wandb", "wandb"),
                    "mlflow": ("mlflow", "mlflow-skinny"), "swanlab": ("swanlab", "swanlab"),
                    "clearml": ("clearml", "clearml"), "trackio": ("trackio", "trackio")}


def missing_backend_package(backend: str) -> str | None:
    """What to install for ``backend`` when its package is missing (None: nothing to install)."""
    if backend == "mlflow":
        missing = missing_mlflow_packages()
        return (f"trainer.logger=mlflow needs {' and '.join(missing)}, which {'is' if len(missing) == 1 else 'are'} "
                f"not installed: pip install {' '.join(missing)} (or remove mlflow from trainer.logger)"
                if missing else None)
    module, package = BACKEND_PACKAGES.get(backend, (None, None))
    if module is None or importlib.util.find_spec(module) is not None:
        return None
    return (f"trainer.logger={backend} needs the {package} package, which is not installed: pip install {package} "
            f"(or remove {backend} from trainer.logger)")


def check_backend_packages(backends) -> None:
    """Raise ConfigError for the first of ``backends`` (``trainer.logger``: a name or a list) whose package is
    missing; run before anything starts."""
    for backend in [backends] if isinstance(backends, str) else list(backends or []):
        problem = missing_backend_package(str(backend))
        if problem:
            raise ConfigError(problem)


def _to_python(value: Any) -> Any:
    if hasattr(value, "item") and callable(value.item):
        try:
            return value.item()
        except (ValueError, RuntimeError):
            pass
    if hasattr(value, "tolist"):
        return value.tolist()
    return value


def concat_dict_to_str(data: dict, step: int) -> str:
    parts = [f"step:{step}"]
    for key, value in data.items():
        value = _to_python(value)
        if isinstance(value, numbers.Number) and not isinstance(value, bool):
            parts.append(f"{key}:{pprint.pformat(value)}")
    return " - ".join(parts)


class ConsoleLogger:
    def log(self, data: dict, step: int) -> None:
        print(concat_dict_to_str(data, step), flush=True)

    def finish(self) -> None:
        pass


def file_logger_path(project_name: str, experiment_name: str) -> str:
    path = os.environ.get("VERL_FILE_LOGGER_PATH")
    if path:
        return os.path.expanduser(path)
    root = os.path.expanduser(os.environ.get("VERL_FILE_LOGGER_ROOT", "."))
    return os.path.join(root, project_name, f"{experiment_name}.jsonl")


class FileLogger:
    def __init__(self, project_name: str, experiment_name: str):
        self.path = file_logger_path(project_name, experiment_name)
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        self._fp = open(self.path, "a", buffering=1)

    def log(self, data: dict, step: int) -> None:
        record = {"step": step, "data": {k: _to_python(v) for k, v in data.items()}}
        self._fp.write(json.dumps(record, default=str) + "\n")
        self._fp.flush()

    def finish(self) -> None:
        if not self._fp.closed:
            self._fp.close()


class TensorboardLogger:
    def __init__(self, project_name: str, experiment_name: str):
        try:  # optional heavy dependency: tensorboard is loaded only when trainer.logger names it
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as e:
            raise ImportError(f"trainer.logger=tensorboard needs the tensorboard package: pip install tensorboard ({e})") from None
        self.log_dir = os.environ.get("TENSORBOARD_DIR") or os.path.join("tensorboard_log", project_name, experiment_name)
        os.makedirs(self.log_dir, exist_ok=True)
        self.writer = SummaryWriter(self.log_dir)

    def log(self, data: dict, step: int) -> None:
        for key, value in data.items():
            value = _to_python(value)
            if isinstance(value, numbers.Number) and not isinstance(value, bool):
                self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def finish(self) -> None:
        self.writer.close()


class WandbLogger:
    def __init__(self, project_name: str, experiment_name: str, config: dict | None):
        try:  # optional heavy dependency: wandb is loaded only when trainer.logger names it
            import wandb
        except ImportError:
            raise ImportError("trainer.logger=wandb needs the wandb package: pip install wandb "
                              "(or drop 'wandb' from trainer.logger, e.g. trainer.logger=[console,file])") from None
        self.wandb = wandb
        kwargs = {}
        if not os.environ.get("WANDB_MODE") and not os.environ.get("WANDB_API_KEY") and not _wandb_logged_in():
            # no credentials (e.g. an offline machine): log locally instead of failing at start-up
            print("wandb: no API key found; logging offline under ./wandb (set WANDB_API_KEY or WANDB_MODE to change)")
            kwargs["mode"] = "offline"
        self.run = wandb.init(project=project_name, name=experiment_name, config=config, **kwargs)

    def log(self, data: dict, step: int) -> None:
        self.wandb.log({k: _to_python(v) for k, v in data.items()}, step=step)

    def finish(self) -> None:
        self.wandb.finish(exit_code=0)


def _numbers_only(data: dict) -> dict:
    out = {}
    for key, value in data.items():
        value = _to_python(value)
        if isinstance(value, numbers.Number) and not isinstance(value, bool):
            out[key] = value
    return out


def flatten_config(config: dict | None, prefix: str = "") -> dict[str, str]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": "1"}``: nested config as flat string parameters (MLflow params)."""
    flat: dict[str, str] = {}
    for key, value in (config or {}).items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(flatten_config(value, name + "."))
        else:
            flat[name] = str(value)
    return flat


_MLFLOW_BAD = re.compile(r"[^A-Za-z0-9_\-. :/]")


def mlflow_metric_name(name: str) -> str:
    """MLflow accepts only alphanumerics, ``_ - . : /`` and spaces in names: ``mean@1`` -> ``mean_at_1``."""
    return _MLFLOW_BAD.sub("_", name.replace("@", "_at_"))


def mlflow_tracking_uri() -> str:
    """The MLflow store of a run: ``$MLFLOW_TRACKING_URI``, else the SQLite file ``./mlflow.db`` (absolute)."""
    return os.environ.get("MLFLOW_TRACKING_URI") or "sqlite:///" + os.path.abspath("mlflow.db")


def missing_mlflow_packages(uri: str | None = None) -> list[str]:
    """The pip packages missing to write to the MLflow store ``uri`` (default: :func:`mlflow_tracking_uri`):
    mlflow-skinny (the ``mlflow`` module; the full mlflow package provides it too), and for a SQLite store the
    database layer that mlflow-skinny leaves out (sqlalchemy, alembic)."""
    uri = uri or mlflow_tracking_uri()
    needed = [("mlflow", "mlflow-skinny")]
    if uri.startswith("sqlite:"):
        needed += [("sqlalchemy", "sqlalchemy"), ("alembic", "alembic")]
    return [package for module, package in needed if importlib.util.find_spec(module) is None]


@contextlib.contextmanager
def mlflow_store_lock(uri: str):
    """Held while a process opens a SQLite store: the first one creates its tables (a migration that takes seconds),
    and the driver's logger and every rollout worker's tracer may open the same new file at once."""
    if not uri.startswith("sqlite:///"):
        yield
        return
    path = os.path.abspath(uri[len("sqlite:///"):])
    os.makedirs(os.path.dirname(path), exist_ok=True)
    digest = hashlib.sha1(path.encode()).hexdigest()[:16]  # the lock file stays out of the user's directory
    with open(os.path.join(tempfile.gettempdir(), f"verl-mlflow-{digest}.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


class MlflowLogger:
    def __init__(self, project_name: str, experiment_name: str, config: dict | None):
        uri = mlflow_tracking_uri()
        missing = missing_mlflow_packages(uri)
        if missing:  # optional dependencies (the mlflow extra): loaded only when trainer.logger names mlflow
            raise ImportError(f"trainer.logger=mlflow needs {', '.join(missing)}: pip install {' '.join(missing)} "
                              f"(or pip install verl[mlflow])")
        import mlflow  # optional heavy dependency (the mlflow extra): loaded only when trainer.logger names it

        self.mlflow = mlflow
        with mlflow_store_lock(uri):
            mlflow.set_tracking_uri(uri)
            experiment = mlflow.set_experiment(project_name)
        self.run = mlflow.start_run(experiment_id=experiment.experiment_id, run_name=experiment_name)
        params = flatten_config(config)
        if params:
            mlflow.log_params(params)

    def log(self, data: dict, step: int) -> None:
        metrics = {mlflow_metric_name(k): float(v) for k, v in _numbers_only(data).items()}
        if metrics:
            self.mlflow.log_metrics(metrics, step=step)

    def finish(self) -> None:
        self.mlflow.end_run()


class SwanlabLogger:
    def __init__(self, project_name: str, experiment_name: str, config: dict | None):
        try:  # optional heavy dependency (the swanlab extra): loaded only when trainer.logger names it
            import swanlab
        except ImportError:
            raise ImportError("trainer.logger=swanlab needs the swanlab package: pip install swanlab "
                              "(or drop 'swanlab' from trainer.logger)") from None
        self.swanlab = swanlab
        api_key = os.environ.get("SWANLAB_API_KEY")
        mode = os.environ.get("SWANLAB_MODE")
        if api_key:
            swanlab.login(api_key=api_key)
        elif not mode:
            print("swanlab: no SWANLAB_API_KEY; logging offline under ./swanlog (set SWANLAB_MODE to change)")
            mode = "offline"
        self.run = swanlab.init(project=project_name, experiment_name=experiment_name, config=config or {},
                                logdir=os.environ.get("SWANLAB_LOG_DIR", "swanlog"), mode=mode or "cloud")

    def log(self, data: dict, step: int) -> None:
        self.swanlab.log(_numbers_only(data), step=step)

    def finish(self) -> None:
        self.swanlab.finish()


class ClearMLLogger:
    def __init__(self, project_name: str, experiment_name: str, config: dict | None):
        try:  # optional heavy dependency (clearml): loaded only when trainer.logger names it
            import clearml
        except ImportError:
            raise ImportError(missing_backend_package("clearml") or "clearml failed to import") from None
        configured = os.environ.get("CLEARML_API_HOST") or os.environ.get("CLEARML_CONFIG_FILE") or any(
            os.path.exists(os.path.expanduser(p)) for p in ("~/clearml.conf", "~/.clearml.conf"))
        if not configured and not os.environ.get("CLEARML_OFFLINE_MODE"):
            print("clearml: no server configured; the task runs offline (set CLEARML_API_HOST or run clearml-init "
                  "to log to a server)")
            clearml.Task.set_offline(offline_mode=True)
        self.task = clearml.Task.init(project_name=project_name, task_name=experiment_name, continue_last_task=True,
                                      output_uri=False)
        if config:
            self.task.connect_configuration(config, name="Hyperparameters")

    def log(self, data: dict, step: int) -> None:
        logger = self.task.get_logger()
        for key, value in _numbers_only(data).items():
            title, _, series = key.partition("/")
            logger.report_scalar(title=title, series=series or title, value=value, iteration=step)

    def finish(self) -> None:
        self.task.close()


class TrackioLogger:
    def __init__(self, project_name: str, experiment_name: str, config: dict | None):
        try:  # optional heavy dependency (trackio): loaded only when trainer.logger names it
            import trackio
        except ImportError:
            raise ImportError(missing_backend_package("trackio") or "trackio failed to import") from None
        self.trackio = trackio
        self.run = trackio.init(project=project_name, name=experiment_name, config=config)

    def log(self, data: dict, step: int) -> None:
        self.trackio.log(_numbers_only(data), step=step)

    def finish(self) -> None:
        self.trackio.finish()


def _wandb_logged_in() -> bool:
    netrc = os.path.expanduser("~/.netrc")
    try:
        with open(netrc) as f:
            return "api.wandb.ai" in f.read()
    except OSError:
        return False


class Tracking:
    supported_backend = list(SUPPORTED_BACKENDS)

    def __init__(self, project_name: str, experiment_name: str, default_backend: str | list[str] = "console",
                 config: Any = None):
        if isinstance(default_backend, str):
            default_backend = [default_backend]
        default_backend = [str(b) for b in default_backend]
        for backend in default_backend:
            if backend not in SUPPORTED_BACKENDS:
                raise ValueError(f"logger backend {backend!r} is not supported; choose from: {', '.join(SUPPORTED_BACKENDS)}")
        if config is not None and not isinstance(config, dict):
            config = OmegaConf.to_container(config, resolve=True)
        self.project_name, self.experiment_name = project_name, experiment_name
        self.logger: dict[str, Any] = {}
        for backend in dict.fromkeys(default_backend):
            if backend == "console":
                self.logger[backend] = ConsoleLogger()
            elif backend == "file":
                self.logger[backend] = FileLogger(project_name, experiment_name)
            elif backend == "tensorboard":
                self.logger[backend] = TensorboardLogger(project_name, experiment_name)
            elif backend == "wandb":
                self.logger[backend] = WandbLogger(project_name, experiment_name, config)
            elif backend == "mlflow":
                self.logger[backend] = MlflowLogger(project_name, experiment_name, config)
            elif backend == "swanlab":
                self.logger[backend] = SwanlabLogger(project_name, experiment_name, config)
            elif backend == "clearml":
                self.logger[backend] = ClearMLLogger(project_name, experiment_name, config)
            elif backend == "trackio":
                self.logger[backend] = TrackioLogger(project_name, experiment_name, config)

    def log(self, data: dict, step: int, backend: list[str] | None = None) -> None:
        for name, logger in self.logger.items():
            if backend is None or name in backend:
                logger.log(data=data, step=step)

    def finish(self) -> None:
        for logger in self.logger.values():
            logger.finish()
        self.logger = {}

    def __del__(self):
        try:
            for name, logger in list(getattr(self, "logger", {}).items()):
                if name == "file":
                    logger.finish()
        except Exception:
            pass


class ValidationGenerationsLogger:
    """Shows a few validation samples (``trainer.log_val_generations``) in the chosen backends."""

    def log(self, loggers: list[str], samples: list[tuple], step: int, tracker: Tracking | None = None) -> None:
        if not samples:
            return
        if "console" in loggers:
            for i, (inp, out, score) in enumerate(samples):
                print(f"[val sample {i} @ step {step}] score={score}\n  prompt: {inp!r}\n  response: {out!r}", flush=True)
        if tracker is None:
            return
        if "file" in loggers and "file" in tracker.logger:
            rows = [{"input": i, "output": o, "score": _to_python(s)} for i, o, s in samples]
            tracker.logger["file"]._fp.write(json.dumps({"step": step, "val_generations": rows}, default=str) + "\n")
        if "tensorboard" in loggers and "tensorboard" in tracker.logger:
            text = "\n\n".join(f"**score {s}**  \n{i}  \n→ {o}" for i, o, s in samples)
            tracker.logger["tensorboard"].writer.add_text("val/generations", text, step)
        if "wandb" in loggers and "wandb" in tracker.logger:
            wandb = tracker.logger["wandb"].wandb
            table = wandb.Table(columns=["step", "input", "output", "score"],
                                data=[[step, i, o, _to_python(s)] for i, o, s in samples])
            wandb.log({"val/generations": table}, step=step)
        if "mlflow" in loggers and "mlflow" in tracker.logger:
            rows = [{"input": i, "output": o, "score": _to_python(s)} for i, o, s in samples]
            tracker.logger["mlflow"].mlflow.log_dict({"step": step, "samples": rows}, f"val_generations/step_{step}.json")
        if "swanlab" in loggers and "swanlab" in tracker.logger:
            swanlab = tracker.logger["swanlab"].swanlab
            texts = [swanlab.Text(f"input: {i}\n\noutput: {o}\n\nscore: {s}") for i, o, s in samples]
            swanlab.log({"val/generations": texts}, step=step)
