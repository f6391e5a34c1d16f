"""The engine registry: ``strategy`` name -> training-engine class, and which worker classes run it.

Light on purpose (no torch, no engine module): the config schema reads :func:`engine_names` to validate
``*.strategy`` before any model code loads, so a strategy registered with :func:`register_engine` is valid
config. verl's own engines are named here by module and imported on first use.
"""

from __future__ import annotations

from typing import Any

from verl.utils.import_utils import load_class

__all__ = ["ENGINES", "WORKERS", "register_engine", "get_engine_cls", "engine_names", "engine_workers"]

# strategy -> engine class, or "module:Class" imported on first use (verl's own engines)
ENGINES: dict[str, Any] = {
    "fsdp": "verl.workers.engine.fsdp:FSDPEngine",
    "fsdp2": "verl.workers.engine.fsdp:FSDPEngine",
    # optional heavy dependency (megatron-core, and ~0.6 s of torch.distributed.optim at import) that FSDP workers
    # never load
    "megatron": "verl.workers.engine.megatron:MegatronEngine",
}
# strategy -> the worker classes that run its roles: "fsdp" (verl.workers.engine_workers: every rank holds rows of
# its own) or "megatron" (verl.workers.megatron_workers: the tensor x pipeline ranks of one replica share rows)
WORKERS: dict[str, str] = {"fsdp": "fsdp", "fsdp2": "fsdp", "megatron": "megatron"}
WORKER_KINDS = ("fsdp", "megatron")


def register_engine(strategy: str, engine_cls: Any, workers: str = "fsdp") -> None:
    """Make ``strategy=<name>`` build ``engine_cls`` (a :class:`~verl.workers.engine.TrainEngine` subclass with a
    ``build(EngineConfig, device_mesh, tokenizer=None)`` classmethod).

    ``workers``: which worker classes run the roles on it: ``"fsdp"`` (the default; every process holds its own
    share of the batch) or ``"megatron"`` (the ``<role>.megatron.tensor_model_parallel_size x
    pipeline_model_parallel_size`` processes of one model replica share theirs). Register in the module named by
    ``actor_rollout_ref.model.external_lib`` (or a ``verl.plugins`` entry point) so that the driver's config check
    and every worker process see the name."""
    if not isinstance(strategy, str) or not strategy:
        raise ValueError(f"register_engine: strategy must be a non-empty str, got {strategy!r}")
    if workers not in WORKER_KINDS:
        raise ValueError(f"register_engine({strategy!r}, workers={workers!r}): workers must be one of "
                         f"{', '.join(WORKER_KINDS)}")
    ENGINES[strategy] = engine_cls
    WORKERS[strategy] = workers


def engine_names() -> tuple[str, ...]:
    """Every registered strategy: verl's (fsdp, fsdp2, megatron) and the user's."""
    return tuple(ENGINES)


def engine_workers(strategy: str) -> str:
    """``"fsdp"`` or ``"megatron"``: the worker classes that run ``strategy``'s roles."""
    if strategy not in WORKERS:
        raise ValueError(_unknown(strategy))
    return WORKERS[strategy]


def get_engine_cls(strategy: str) -> Any:
    """The engine class registered for ``strategy`` (importing verl's own on first use)."""
    try:
        entry = ENGINES[strategy]
    except KeyError:
        raise ValueError(_unknown(strategy)) from None
    if isinstance(entry, str):
        entry = ENGINES[strategy] = load_class(entry)
    return entry


def _unknown(strategy: str) -> str:
    return (f"strategy={strategy!r} has no training engine here; choose one of: {', '.join(ENGINES)}, or register "
            "yours with verl.workers.engine.register_engine in actor_rollout_ref.model.external_lib")
