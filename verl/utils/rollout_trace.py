"""Rollout tracing (verl's ``actor_rollout_ref.rollout.trace.*``): every agent-loop episode recorded as a trace.

    actor_rollout_ref.rollout.trace.backend=mlflow                     # null (default): nothing is recorded
    actor_rollout_ref.rollout.trace.token2text=True                    # decoded text beside the token ids
    actor_rollout_ref.rollout.trace.max_samples_per_step_per_worker=4  # null: every sample

What is recorded. An episode (one sample, one of its ``rollout.n`` rollouts) is one trace named ``agent_loop``,
tagged ``step``, ``sample_index``, ``rollout_n``, ``validate`` and ``experiment_name`` (:func:`rollout_trace_attr`).
Inside it, one span per call of a method decorated with :func:`rollout_trace_op`, named by the method
(``ToolAgentLoop.run``, ``AsyncLLMServerManager.generate``, ``ToolAgentLoop._call_tool``): its inputs are the
call's arguments, its outputs the return value. With ``token2text``, an output that carries token ids
(``prompt_ids``, ``response_ids``, ``token_ids``) is recorded with their text beside them (``prompt_text``,
``response_text``, ``text``), decoded with the ``tokenizer`` of the object the method belongs to.

``max_samples_per_step_per_worker=k``: each agent-loop worker traces at most ``k`` distinct samples per step (all
``rollout.n`` rollouts of each), picked at random with the step number as seed (:func:`traced_samples`); the other
episodes run untraced. Traces per step: at most k x (workers running agent loops) x rollout.n.

Backends:

* ``None``: nothing is recorded; a decorated method costs one attribute read per call.
* ``mlflow``: MLflow tracing (mlflow-skinny is enough). The traces go to the MLflow experiment named
  ``trainer.project_name`` -- where ``trainer.logger=mlflow`` puts its run, named ``trainer.experiment_name`` --
  in the store ``$MLFLOW_TRACKING_URI``, else the SQLite file ``mlflow.db`` in the directory the run was started
  from (the logger's default too; a local Ray runs the workers there; on a joined cluster set
  MLFLOW_TRACKING_URI, which the driver passes to the workers). A SQLite store also needs sqlalchemy and alembic
  (``pip install verl[mlflow]``); MLflow 3 refuses its file store (``./mlruns``) unless
  ``MLFLOW_ALLOW_FILE_STORE=true``. Spans are exported in the background; the agent-loop worker flushes them at
  the end of every rollout step (:meth:`RolloutTraceConfig.flush`, in a thread). Reading them back:
  docs/multiturn.md, "Tracing rollouts".
* ``weave``: refused (:data:`WEAVE_REFUSED`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import os
import random
import threading
from contextvars import ContextVar
from typing import Any, Iterable, Optional

from omegaconf import DictConfig

from verl.utils.tracking import missing_mlflow_packages, mlflow_store_lock, mlflow_tracking_uri

__all__ = ["RolloutTraceConfig", "rollout_trace_attr", "rollout_trace_op", "traced_samples", "trainer_run_names",
           "missing_trace_package", "WEAVE_REFUSED"]

KEY = "actor_rollout_ref.rollout.trace"
WEAVE_REFUSED = ("weave records traces in the W&B Weave service (weave.init signs in to wandb.ai or a W&B server), "
                 "which this build neither sets up nor tests; use trace.backend=mlflow (a local store, no server) "
                 "or leave it null")
# output fields holding token ids -> the field their decoded text is recorded in (token2text)
TOKEN_FIELDS = (("prompt_ids", "prompt_text"), ("response_ids", "response_text"), ("token_ids", "text"))

# False inside rollout_trace_attr(trace=False): the episode's decorated calls record nothing
_trace_enabled: ContextVar[bool] = ContextVar("verl_rollout_trace_enabled", default=True)


def missing_trace_package(backend: Optional[str]) -> Optional[str]:
    """Why ``trace.backend=backend`` cannot run in this environment (None: it can): weave is refused, mlflow
    needs its packages. The driver checks this before any worker starts."""
    if backend is None:
        return None
    if backend == "weave":
        return f"{KEY}.backend=weave is not supported: {WEAVE_REFUSED}"
    if backend != "mlflow":
        return f"{KEY}.backend={backend!r} is not a tracing backend; use mlflow or null"
    missing = missing_mlflow_packages()
    if not missing:
        return None
    return (f"{KEY}.backend=mlflow needs {' and '.join(missing)}, not installed here: pip install {' '.join(missing)} "
            f"(or pip install verl[mlflow]; or leave {KEY}.backend null)")


class RolloutTraceConfig:
    """The tracing settings of this process (verl's singleton): set by :meth:`init` in the agent-loop worker, read by
    :func:`rollout_trace_attr` and :func:`rollout_trace_op`.

    Unlike verl, which keeps the first ``init`` of a process, a later ``init`` with other settings replaces them
    (a process that builds another agent-loop worker, or a test, gets what it asks for)."""

    _instance: Optional[RolloutTraceConfig] = None

    def __init__(self) -> None:
        self.backend: Optional[str] = None
        self.client: Any = None  # the mlflow module with backend=mlflow
        self.token2text = False
        self.project_name: Optional[str] = None
        self.experiment_name: Optional[str] = None
        self.max_samples_per_step_per_worker: Optional[int] = None
        self.tracking_uri: Optional[str] = None
        self.experiment_id: Optional[str] = None
        self._initialized = False
        self._settings: tuple = ()
        self._flusher: Optional[threading.Thread] = None

    @classmethod
    def get_instance(cls) -> RolloutTraceConfig:
        if cls._instance is None:
            cls._instance = cls()
        return cls._instance

    @classmethod
    def init(cls, project_name: str, experiment_name: str, backend: Optional[str], token2text: bool = False,
             max_samples_per_step_per_worker: Optional[int] = None) -> None:
        """Trace with ``backend`` (None, "mlflow"; "weave" is refused with the reason) into the project /
        experiment of the run (``trainer.project_name`` / ``trainer.experiment_name``)."""
        cap = max_samples_per_step_per_worker
        if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 0):
            raise ValueError(f"{KEY}.max_samples_per_step_per_worker={cap!r} must be an integer >= 0 or null")
        config = cls.get_instance()
        settings = (project_name, experiment_name, backend, bool(token2text), cap)
        if config._initialized and settings == config._settings:
            return
        problem = missing_trace_package(backend)
        if problem:
            raise (ImportError if backend == "mlflow" else ValueError)(problem)
        client = tracking_uri = experiment_id = None
        if backend == "mlflow":
            client, tracking_uri, experiment_id = _open_mlflow(str(project_name))
        config.backend, config.client, config.token2text = backend, client, bool(token2text)
        config.project_name, config.experiment_name = project_name, experiment_name
        config.max_samples_per_step_per_worker = cap
        config.tracking_uri, config.experiment_id = tracking_uri, experiment_id
        config._initialized, config._settings = True, settings

    @classmethod
    def get_backend(cls) -> Optional[str]:
        return cls.get_instance().backend

    @classmethod
    def get_client(cls) -> Any:
        return cls.get_instance().client

    @classmethod
    def enable_token2text(cls) -> bool:
        return cls.get_instance().token2text

    @classmethod
    def flush(cls, wait: bool = True) -> None:
        """Write the spans recorded so far to the store (mlflow exports them from a queue in the background; a
        worker process that Ray ends may never run MLflow's exit hook). ``wait=False``: the flush runs in a thread
        and the caller goes on (MLflow's flush waits up to a second for its queue's consumer to notice)."""
        config = cls._instance
        if config is None or config.backend != "mlflow":
            return
        if config._flusher is not None:
            config._flusher.join()
            config._flusher = None
        if wait:
            config.client.flush_trace_async_logging()
        else:
            config._flusher = threading.Thread(target=config.client.flush_trace_async_logging,
                                               name="verl-rollout-trace-flush", daemon=True)
            config._flusher.start()

    @classmethod
    def reset(cls) -> None:
        """Back to no tracing (spans still queued are flushed first)."""
        cls.flush()
        cls._instance = None


def _open_mlflow(project_name: str) -> tuple[Any, str, str]:
    """(mlflow, tracking URI, id of the experiment ``project_name``), creating the experiment if needed."""
    import mlflow  # optional heavy dependency (the mlflow extra): loaded only with trace.backend=mlflow
    from mlflow.exceptions import MlflowException  # optional, as above

    uri = mlflow_tracking_uri()
    with mlflow_store_lock(uri):
        mlflow.set_tracking_uri(uri)  # process-wide: the background exporter writes to the current tracking URI
        client = mlflow.MlflowClient(uri)
        experiment = client.get_experiment_by_name(project_name)
        if experiment is not None:
            return mlflow, uri, experiment.experiment_id
        # a SQLite store: artifacts beside the file, not in ./mlruns of whatever directory this worker runs in
        where = (os.path.join(os.path.dirname(os.path.abspath(uri[len("sqlite:///"):])), "mlruns", project_name)
                 if uri.startswith("sqlite:///") else None)
        try:
            return mlflow, uri, client.create_experiment(project_name, artifact_location=where)
        except MlflowException:  # another worker created it first (a store without the lock: a tracking server)
            return mlflow, uri, client.get_experiment_by_name(project_name).experiment_id


def trainer_run_names(config: Any) -> tuple[str, str]:
    """(``trainer.project_name``, ``trainer.experiment_name``) of the run whose config ``config`` is a section of
    (a worker's section as the driver sent it still belongs to the whole config); verl's defaults
    (verl_examples, gsm8k) for a section built on its own."""
    root = config._get_root() if isinstance(config, DictConfig) else None
    trainer = root.get("trainer") if root is not None and "trainer" in root else None
    project = trainer.get("project_name") if trainer is not None else None
    experiment = trainer.get("experiment_name") if trainer is not None else None
    return str(project or "verl_examples"), str(experiment or "gsm8k")


def traced_samples(sample_ids: Iterable, step: Any) -> Optional[set]:
    """The sample ids whose episodes are traced this step: None for all of them (no tracing backend, or no
    ``max_samples_per_step_per_worker``); else at most that many of the distinct ids, picked at random with
    ``step`` as the seed (the trainer's random state is left alone)."""
    config = RolloutTraceConfig._instance
    if config is None or config.backend is None or config.max_samples_per_step_per_worker is None:
        return None
    distinct = sorted(set(sample_ids), key=repr)
    cap = config.max_samples_per_step_per_worker
    if cap >= len(distinct):
        return set(distinct)
    return set(random.Random(repr(step)).sample(distinct, cap))


@contextlib.contextmanager
def rollout_trace_attr(sample_index: Any = None, step: Any = None, rollout_n: Any = None, name: str = "rollout_trace",
                       validate: bool = False, trace: bool = True):
    """The trace of one episode (verl's names): with a backend, a root span ``name`` tagged with the step, sample
    index, rollout number, validate flag and the run's experiment name, around the episode's decorated calls;
    ``trace=False``: the episode runs and nothing inside it is recorded. Without a backend: nothing."""
    config = RolloutTraceConfig._instance
    if config is None or config.backend is None:
        yield
        return
    if not trace:
        token = _trace_enabled.set(False)
        try:
            yield
        finally:
            _trace_enabled.reset(token)
        return
    tags = {"step": step, "sample_index": sample_index, "rollout_n": rollout_n}
    tags = {k: str(_plain(v)) for k, v in tags.items() if v is not None}
    tags.update(validate=str(bool(validate)), experiment_name=str(config.experiment_name))
    with _span(config, name):
        config.client.update_current_trace(tags=tags)
        yield


def _span(config: RolloutTraceConfig, name: str):
    """An MLflow span ``name``: a child of the active span, or the root of a new trace in the run's experiment."""
    mlflow = config.client
    if mlflow.get_current_active_span() is not None:
        return mlflow.start_span(name=name)
    from mlflow.entities.trace_location import MlflowExperimentLocation  # optional (mlflow): see _open_mlflow

    return mlflow.start_span(name=name, trace_destination=MlflowExperimentLocation(config.experiment_id))


def rollout_trace_op(func):
    """Decorator of a method (async or not; verl's name): with a backend, each call is a span named by the method,
    its arguments (``self`` left out) as inputs and its return value as outputs (with the decoded text of token
    ids under ``token2text``). Without one, or inside ``rollout_trace_attr(trace=False)``, a plain call."""
    signature = inspect.signature(func)

    def recording() -> Optional[RolloutTraceConfig]:
        config = RolloutTraceConfig._instance
        if config is None or config.backend is None or not _trace_enabled.get():
            return None
        return config

    def inputs(args, kwargs) -> dict:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        return {k: _plain(v) for k, v in list(bound.arguments.items())[1:]}  # the first argument is self

    if inspect.iscoroutinefunction(func):
        @functools.wraps(func)
        async def async_wrapper(*args, **kwargs):
            config = recording()
            if config is None:
                return await func(*args, **kwargs)
            with _span(config, func.__qualname__) as span:
                span.set_inputs(inputs(args, kwargs))
                result = await func(*args, **kwargs)
                span.set_outputs(_outputs(args[0], result, config.token2text))
            return result

        return async_wrapper

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        config = recording()
        if config is None:
            return func(*args, **kwargs)
        with _span(config, func.__qualname__) as span:
            span.set_inputs(inputs(args, kwargs))
            result = func(*args, **kwargs)
            span.set_outputs(_outputs(args[0], result, config.token2text))
        return result

    return wrapper


def _outputs(owner: Any, result: Any, token2text: bool) -> Any:
    """``result`` as recorded: plain Python values; with ``token2text`` and a tokenizer on ``owner``, every token-id
    field of a record gets its text beside it."""
    plain = _plain(result)
    tokenizer = getattr(owner, "tokenizer", None)
    if not token2text or not isinstance(plain, dict) or not hasattr(tokenizer, "decode"):
        return plain
    for ids_field, text_field in TOKEN_FIELDS:
        ids = plain.get(ids_field)
        if isinstance(ids, list) and all(isinstance(t, int) for t in ids):
            plain[text_field] = tokenizer.decode(ids)
    return plain


def _plain(value: Any) -> Any:
    """JSON-friendly copy: pydantic models and dataclasses as dicts, numpy / torch values as Python numbers and
    lists (MLflow would record them as their repr)."""
    if isinstance(value, type):
        return value.__qualname__
    if hasattr(value, "model_dump"):
        return _plain(value.model_dump())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "tolist") and callable(value.tolist):  # numpy arrays and scalars, torch tensors
        return _plain(value.tolist())
    return value
