"""The base class of every worker process (actor, critic, rollout, reward model ...).

A worker learns its place from environment variables that its worker group sets when it starts the
process, exactly like a ``torchrun`` rank does: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT,
LOCAL_RANK, LOCAL_WORLD_SIZE. So ``torch.distributed.init_process_group(backend=get_dist_backend())``
works inside a worker with no arguments. The group also passes the CPU share the worker's resource
pool gave it (VERL_NUM_THREADS); the worker applies it with ``torch.set_num_threads`` so that two
workers on a 2-core machine do not each start two compute threads.

This module does not import Ray: the same worker class could be driven by another backend.
"""

from __future__ import annotations

import os
import random
import socket
import sys
from dataclasses import dataclass

import torch

from verl.single_controller.base.decorator import Dispatch, Execute, register
from verl.utils.device import get_visible_devices_env

ENV_NUM_THREADS = "VERL_NUM_THREADS"
ENV_DISABLE_WORKER_INIT = "DISABLE_WORKER_INIT"  # set while building role instances inside a colocated worker


def _ephemeral_range() -> tuple[int, int]:
    """The ports the OS hands out as source ports of outgoing connections (Linux default 32768-60999)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(v) for v in f.read().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


def get_free_port(host: str = "") -> int:
    """A TCP port that is free on this machine right now.

    The port is bound by someone else later (torch.distributed's rendezvous store), so it is drawn below the OS's
    ephemeral range when there is room: a port the OS picks is one it also hands out as the source port of the
    next outgoing connection (Ray opens many), and that race failed a run with EADDRINUSE. Falls back to a port
    the OS picks."""
    low, _ = _ephemeral_range()
    rng = random.Random()  # not the global generator: seeded training code must not change which port is picked
    if low > 20000:
        for _ in range(64):
            port = rng.randrange(max(1024, low - 12000), low)
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                try:
                    sock.bind((host, port))
                except OSError:
                    continue
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def apply_thread_share() -> int | None:
    """Set torch's intra-op thread count from VERL_NUM_THREADS (if the group set it); returns it."""
    value = os.environ.get(ENV_NUM_THREADS)
    if not value:
        return None
    n = max(1, int(float(value)))
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)
    os.environ["OMP_NUM_THREADS"] = str(n)  # for libraries that read it later (vLLM's CPU backend)
    return n


@dataclass
class DistRankInfo:
    """This worker's coordinates in a tensor x data x pipeline x context parallel mesh."""

    tp_rank: int
    dp_rank: int
    pp_rank: int
    cp_rank: int


@dataclass
class DistGlobalInfo:
    """The sizes of that mesh."""

    tp_size: int
    dp_size: int
    pp_size: int
    cp_size: int


class WorkerMeta:
    """The distributed facts of one worker, as read from its environment."""

    keys = ("WORLD_SIZE", "RANK", "LOCAL_WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")

    def __init__(self, store: dict):
        self._store = dict(store)

    def to_dict(self) -> dict:
        return {f"_{k.lower()}": self._store.get(k) for k in self.keys}


class Worker:
    """Base class for user workers; subclasses call ``super().__init__()`` first.

    Methods decorated with ``@register`` become methods of the worker group. The base class
    registers a few of its own (``_query_dispatch_info``/``_query_collect_info`` for dp meshes,
    ``execute_with_func_generator``, ``execute_func_rank_zero``, ``get_master_addr_port``).
    """

    def __new__(cls, *args, **kwargs):
        instance = super().__new__(cls)
        # Threads first: before the user's __init__ builds models. Role instances inside a colocated
        # worker skip it (the outer worker already did it).
        if not int(os.environ.get(ENV_DISABLE_WORKER_INIT, "0")):
            apply_thread_share()
        return instance

    def __init__(self, cuda_visible_devices=None) -> None:
        env = os.environ
        self._rank = int(env.get("RANK", "0"))
        self._world_size = int(env.get("WORLD_SIZE", "1"))
        self._local_rank = int(env.get("LOCAL_RANK", "0"))
        self._local_world_size = int(env.get("LOCAL_WORLD_SIZE", str(self._world_size)))
        self._master_addr = env.get("MASTER_ADDR")
        self._master_port = env.get("MASTER_PORT")
        if self._world_size == 1 and (self._master_addr is None or self._master_port is None):
            # A lone worker (or one built outside a group) can still init a 1-process group.
            self._master_addr = self._master_addr or "127.0.0.1"
            self._master_port = self._master_port or str(get_free_port("127.0.0.1"))
            env.setdefault("MASTER_ADDR", self._master_addr)
            env.setdefault("MASTER_PORT", self._master_port)
        self._cuda_visible_devices = cuda_visible_devices
        self.__dispatch_dp_rank: dict[str, int] = {}
        self.__collect_dp_rank: dict[str, bool] = {}

    # --- identity -------------------------------------------------------------------------
    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return self._world_size

    @property
    def local_rank(self) -> int:
        return self._local_rank

    @property
    def local_world_size(self) -> int:
        return self._local_world_size

    def get_master_addr_port(self) -> tuple[str | None, str | None]:
        """(MASTER_ADDR, MASTER_PORT) of the group: rank 0's node and a port free there."""
        return self._master_addr, self._master_port

    def get_cuda_visible_devices(self):
        name = get_visible_devices_env()
        return os.environ.get(name, "not set") if name else "not set"

    @staticmethod
    def get_availale_master_addr_port() -> tuple[str, str]:  # verl's spelling
        return Worker.get_node_ip(), str(get_free_port())

    @staticmethod
    def get_node_ip() -> str:
        """This node's IP as Ray knows it inside a Ray worker (Ray is then already imported), else loopback."""
        ray = sys.modules.get("ray")
        if ray is None:
            return "127.0.0.1"
        try:
            node_ip = getattr(getattr(ray, "_private").worker.global_worker, "node_ip_address", None)
            return node_ip or ray.util.get_node_ip_address()
        except Exception:
            return "127.0.0.1"

    # --- data-parallel meshes ------------------------------------------------------------
    def _register_dispatch_collect_info(self, mesh_name: str, dp_rank: int, is_collect: bool) -> None:
        """Declare this worker's dp rank in ``mesh_name`` and whether its output is collected.

        With ``make_nd_compute_dataproto_dispatch_fn(mesh_name)`` every worker then receives the
        chunk of its dp rank, and only the collect rank of each dp group contributes to the result.
        """
        if mesh_name in self.__dispatch_dp_rank:
            raise ValueError(f"rank {self.rank}: mesh {mesh_name!r} is already registered on this worker")
        if dp_rank < 0:
            raise ValueError(f"rank {self.rank}: dp_rank={dp_rank} for mesh {mesh_name!r} must be >= 0")
        self.__dispatch_dp_rank[mesh_name] = int(dp_rank)
        self.__collect_dp_rank[mesh_name] = bool(is_collect)

    def _lookup_mesh(self, table: dict, mesh_name: str):
        if mesh_name not in table:
            raise ValueError(
                f"rank {self.rank}: mesh {mesh_name!r} was never declared; call "
                f"self._register_dispatch_collect_info({mesh_name!r}, dp_rank=..., is_collect=...) in __init__"
                f" (declared: {sorted(table)})"
            )
        return table[mesh_name]

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def _query_dispatch_info(self, mesh_name: str) -> int:
        return self._lookup_mesh(self.__dispatch_dp_rank, mesh_name)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def _query_collect_info(self, mesh_name: str) -> bool:
        return self._lookup_mesh(self.__collect_dp_rank, mesh_name)

    # --- generic helpers callable through the group ----------------------------------------
    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO_WITH_FUNC)
    def execute_with_func_generator(self, func, *args, **kwargs):
        return func(self, *args, **kwargs)

    @register(dispatch_mode=Dispatch.ALL_TO_ALL, execute_mode=Execute.RANK_ZERO)
    def execute_func_rank_zero(self, func, *args, **kwargs):
        return func(*args, **kwargs)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def _get_worker_info(self) -> dict:
        """Rank, pid, node and thread count: used by the group for error messages and by tests."""
        return {
            "rank": self._rank,
            "world_size": self._world_size,
            "local_rank": self._local_rank,
            "local_world_size": self._local_world_size,
            "pid": os.getpid(),
            "node_ip": self.get_node_ip(),
            "num_threads": torch.get_num_threads(),
            "master_addr": self._master_addr,
            "master_port": self._master_port,
        }
