"""Ray resources for worker groups: placement groups per pool, and deferred actor construction.

CPU accounting. Every worker process gets one placement-group bundle. On an accelerator machine a
bundle is ``{"CPU": c, "GPU": 1}`` (resource name from ``verl.utils.device``); on CPU it is
``{"CPU": c}``. ``c`` is ``num_cpus_per_process`` when given, otherwise ``min(1, free CPUs / processes)``
measured when the pool is created, so ``ray.init(num_cpus=2)`` with a 2-process pool fits exactly and
``ray.init(num_cpus=100)`` does not hand 50 logical CPUs to each process. (ResourcePoolManager passes
an explicit share computed over all its pools.) Several worker groups may share one pool
(``max_colocate_count``): each actor then asks for ``c / max_colocate_count`` of its bundle.

Threads. A worker's compute thread count is its CPU share bounded by the node's real cores divided by
the pool's processes on that node, at least 1; it reaches the worker as ``VERL_NUM_THREADS`` and
``OMP_NUM_THREADS``.
"""

from __future__ import annotations

import math
import os
import time
import warnings

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group

from verl.single_controller.base import ClassWithInitArgs, ResourcePool
from verl.single_controller.base.worker import apply_thread_share, get_free_port
from verl.utils.device import get_ray_resource_name
from verl.utils.unsupported import unsupported, unsupported_class

PG_READY_TIMEOUT_S = float(os.environ.get("VERL_PG_READY_TIMEOUT_S", "60"))


def _free_cpus() -> float:
    return float(ray.available_resources().get("CPU", 0.0))


def _fmt_resources(res: dict) -> str:
    return ", ".join(f"{k}={v:g}" for k, v in sorted(res.items()) if not k.startswith("node:") and "_group_" not in k)


class RayResourcePool(ResourcePool):
    """A set of Ray placement groups (one per node entry) holding one bundle per worker process."""

    def __init__(
        self,
        process_on_nodes: list[int] | None = None,
        use_gpu: bool = True,
        name_prefix: str | None = None,
        max_colocate_count: int = 10,
        detached: bool = False,
        accelerator_type: str | None = None,
        num_cpus_per_process: float | None = None,
    ) -> None:
        super().__init__(process_on_nodes, max_colocate_count)
        accel = get_ray_resource_name()
        if use_gpu and accel is None:
            # verl's default is use_gpu=True; on a CPU-only machine that means "one process per bundle".
            use_gpu = False
        self.use_gpu = use_gpu
        self.accelerator_resource = accel if use_gpu else None
        self.name_prefix = name_prefix or ""
        self.detached = detached
        self.accelerator_type = accelerator_type
        if num_cpus_per_process is not None and num_cpus_per_process <= 0:
            raise ValueError(f"num_cpus_per_process={num_cpus_per_process} must be > 0")
        self.num_cpus_per_process = num_cpus_per_process
        self.pgs: list[PlacementGroup] | None = None

    # -- sizing ------------------------------------------------------------------------------
    def _bundle(self) -> dict:
        if self.num_cpus_per_process is None:
            free = _free_cpus()
            share = min(1.0, free / max(1, self.world_size))
            if share < 0.01:
                raise RuntimeError(
                    f"RayResourcePool{self.store}: only {free:g} free CPUs in the Ray cluster for "
                    f"{self.world_size} worker processes. Start Ray with more CPUs (ray.init(num_cpus=...)), "
                    f"free other pools (RayResourcePool.remove()), or pass num_cpus_per_process=<fraction>."
                )
            self.num_cpus_per_process = math.floor(share * 1000) / 1000
        bundle = {"CPU": self.num_cpus_per_process}
        if self.accelerator_resource:
            bundle[self.accelerator_resource] = 1
        if self.accelerator_type:
            bundle[f"accelerator_type:{self.accelerator_type}"] = 0.001
        return bundle

    def get_placement_groups(self, strategy: str = "STRICT_PACK", name: str | None = None) -> list[PlacementGroup]:
        """Create (once) and return the placement groups, one per node entry, waiting until ready."""
        if self.pgs is not None:
            return self.pgs
        bundle = self._bundle()
        self._check_feasible(bundle, strategy)
        prefix = name or self.name_prefix or f"verl_pool_{id(self):x}"
        lifetime = "detached" if self.detached else None
        pgs = [
            placement_group(
                bundles=[dict(bundle) for _ in range(n)],
                strategy=strategy,
                name=f"{prefix}_pg{i}",
                lifetime=lifetime,
            )
            for i, n in enumerate(self._store)
        ]
        try:
            ray.get([pg.ready() for pg in pgs], timeout=PG_READY_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            for pg in pgs:
                remove_placement_group(pg)
            raise self._error(bundle, strategy, f"not free within {PG_READY_TIMEOUT_S:g}s") from None
        self.pgs = pgs
        return pgs

    def _error(self, bundle: dict, strategy: str, why: str) -> RuntimeError:
        return RuntimeError(
            f"RayResourcePool(process_on_nodes={self.store}) could not reserve {self.world_size} bundles of "
            f"{{{_fmt_resources(bundle)}}} ({why}; strategy {strategy}: each node entry must fit on one node). "
            f"Cluster total: {{{_fmt_resources(ray.cluster_resources())}}}; free now: "
            f"{{{_fmt_resources(ray.available_resources())}}}. Lower process_on_nodes / num_cpus_per_process, "
            f"free other pools (RayResourcePool.remove()), or start Ray with more resources."
        )

    def _check_feasible(self, bundle: dict, strategy: str) -> None:
        """Fail at once when no node could ever hold a node entry (Ray would wait forever)."""
        nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive", True)]
        for count in self._store:
            if not any(all(res.get(k, 0) + 1e-9 >= v * count for k, v in bundle.items()) for res in nodes):
                raise self._error(bundle, strategy, f"no node has room for {count} of them")

    def thread_share(self, node_cores: int, procs_on_node: int) -> int:
        share = self.num_cpus_per_process or 1.0
        # shares are trimmed a little below the free CPUs (e.g. 1.998 of 2) so that they always fit; that trim
        # must not cost a whole thread (a lone worker on 2 cores ran its updates on 1 thread, 1.6x slower)
        return max(1, min(int(share + 0.01), node_cores // max(1, procs_on_node)))

    def remove(self, wait_s: float = 10.0) -> None:
        """Release the placement groups (kills the actors placed in them); the pool can be rebuilt.

        Waits (up to ``wait_s``) until Ray reports the CPUs free again, so that a pool created right
        after this sees them (Ray's resource view lags removals by a moment).
        """
        if not self.pgs:
            return
        freed = (self.num_cpus_per_process or 0.0) * self.world_size
        before = _free_cpus()
        for pg in self.pgs:
            try:
                remove_placement_group(pg)
            except Exception as err:  # already gone
                warnings.warn(f"removing placement group failed: {err}", stacklevel=2)
        self.pgs = None
        deadline = time.monotonic() + wait_s
        while _free_cpus() + 1e-6 < before + freed and time.monotonic() < deadline:
            time.sleep(0.05)


def sort_placement_group_by_node_ip(pgs: list[PlacementGroup]) -> list[PlacementGroup]:
    """Placement groups ordered by the IP of the node holding their first bundle.

    Ranks then follow node order across runs, so a sharded checkpoint written by rank r on node n is read back
    by the same rank after a restart.
    """
    ips = {node["NodeID"]: node["NodeManagerAddress"] for node in ray.nodes()}
    return sorted(pgs, key=lambda pg: ips.get(node_id_of_bundle(pg, 0) or "", ""))


_SPLIT_POOLS = "splitting or merging resource pools (disaggregated rollout replicas of the agent loop)"
_SPLIT_CONFIG = "actor_rollout_ref.rollout.mode=async with separate rollout resource pools"
_SPLIT_INSTEAD = "one RayResourcePool per role, mapped by ResourcePoolManager"

SubRayResourcePool = unsupported_class("SubRayResourcePool", _SPLIT_POOLS, _SPLIT_CONFIG, _SPLIT_INSTEAD,
                                       bases=(RayResourcePool,), module=__name__)


def split_resource_pool(resource_pool, split_size):
    """verl: split one pool into sub-pools. Not supported yet (NotImplementedError naming the capability)."""
    unsupported("split_resource_pool", _SPLIT_POOLS, _SPLIT_CONFIG, _SPLIT_INSTEAD)


def merge_resource_pool(rp1, rp2):
    """verl: join two pools into one. Not supported yet (NotImplementedError naming the capability)."""
    unsupported("merge_resource_pool", _SPLIT_POOLS, _SPLIT_CONFIG, _SPLIT_INSTEAD)


def extract_pg_from_exist(resource_pools, src_role_names, resource_pool):
    """verl: reuse another role's placement groups. Not supported yet (NotImplementedError)."""
    unsupported("extract_pg_from_exist", _SPLIT_POOLS, _SPLIT_CONFIG, _SPLIT_INSTEAD)


def node_id_of_bundle(pg: PlacementGroup, bundle_index: int) -> str | None:
    return ray.util.placement_group_table(pg)["bundles_to_node_id"].get(bundle_index)


def _node(node_id: str | None) -> dict | None:
    for node in ray.nodes():
        if node["NodeID"] == node_id:
            return node
    return None


def _is_driver_node(node_id: str | None) -> bool:
    return node_id is None or node_id == ray.get_runtime_context().get_node_id()


def node_cores(node_id: str | None) -> int:
    """Real cores of a node: this machine's count if it is the driver's node, else Ray's CPU total."""
    if _is_driver_node(node_id):
        return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    node = _node(node_id)
    return int(node["Resources"].get("CPU", 1)) if node else 1


@ray.remote(num_cpus=0)
def _pick_port_on_node() -> int:
    return get_free_port()


def pick_master_addr_port(pg: PlacementGroup, bundle_index: int = 0) -> tuple[str, str]:
    """Rank 0's node address (as Ray knows it, e.g. 127.0.0.1 for a loopback cluster) and a port free
    there; the port is picked on that node by a tiny task when it is not the driver's node."""
    node_id = node_id_of_bundle(pg, bundle_index)
    node = _node(node_id)
    addr = node["NodeManagerAddress"] if node else ray.util.get_node_ip_address()
    if _is_driver_node(node_id):
        return addr, str(get_free_port())
    strategy = ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)
    return addr, str(ray.get(_pick_port_on_node.options(scheduling_strategy=strategy).remote()))


_ENV_KWARG = "_verl_worker_env"


def _with_worker_env(cls):
    """A subclass of ``cls`` whose constructor first exports the worker's environment.

    Ray builds an actor with ``cls.__new__(cls)`` and then calls ``__init__``; here ``__init__`` pops the
    environment argument, updates ``os.environ``, applies the thread share and only then runs the
    user's constructor, so ``Worker.__init__`` reads RANK, WORLD_SIZE, MASTER_ADDR ... as usual.
    """

    def __init__(self, *args, **kwargs):
        env = kwargs.pop(_ENV_KWARG, None) or {}
        os.environ.update({k: str(v) for k, v in env.items()})
        apply_thread_share()
        cls.__init__(self, *args, **kwargs)

    sub = type(cls.__name__, (cls,), {"__init__": __init__, "__doc__": cls.__doc__})
    sub.__qualname__ = cls.__qualname__
    sub.__module__ = cls.__module__
    return sub


class RayClassWithInitArgs(ClassWithInitArgs):
    """A worker class and its constructor arguments, plus the Ray actor options to start it with."""

    def __init__(self, cls, *args, **kwargs) -> None:
        super().__init__(cls, *args, **kwargs)
        self._options: dict = {}
        self._additional_resource: dict = {}

    def set_additional_resource(self, additional_resource: dict) -> None:
        """Extra custom Ray resources each actor asks for (e.g. ``{"my_node_label": 0.01}``)."""
        self._additional_resource = dict(additional_resource)

    def update_options(self, options: dict) -> None:
        """Extra ``.options(...)`` for every actor (runtime_env is merged, env vars included)."""
        self._options.update(options)

    def _remote_cls(self):
        """The Ray actor class to start: the user class under a thin subclass that applies the
        per-rank environment first (see ``_with_worker_env``), with any ``@ray.remote`` defaults kept."""
        if getattr(self, "_remote_cache", None) is None:
            cls = self.cls
            defaults = {}
            if hasattr(cls, "options") and hasattr(cls, "remote"):  # already @ray.remote
                defaults = dict(getattr(cls, "_default_options", None) or {})
                cls = cls.__ray_actor_class__
            self._remote_cache = (ray.remote(_with_worker_env(cls)), defaults)
        return self._remote_cache

    def create_actor(self, options: dict, env_vars: dict | None = None):
        """Start one actor with ``options`` (scheduling, resources, name) and extra ``env_vars``.

        The per-rank variables (RANK, MASTER_PORT ...) go in as a constructor argument rather than a
        Ray ``runtime_env``: actors without a runtime_env can start in Ray's pre-started worker
        processes, which makes a group start several seconds faster on a small machine.
        """
        remote_cls, defaults = self._remote_cls()
        merged = dict(defaults)
        merged.update(self._options)
        merged.update(options)
        if self._additional_resource:
            resources = dict(merged.get("resources") or {})
            resources.update(self._additional_resource)
            merged["resources"] = resources
        kwargs = dict(self.kwargs)
        kwargs[_ENV_KWARG] = dict(env_vars or {})
        return remote_cls.options(**merged).remote(*self.args, **kwargs)

    def __call__(
        self,
        placement_group=None,
        placement_group_bundle_idx=None,
        use_gpu: bool = False,
        num_gpus: float = 1,
        sharing_with=None,
        **options,
    ):
        """verl-style direct construction of one actor (worker groups use ``create_actor``)."""
        opts = dict(options)
        if placement_group is not None:
            opts["scheduling_strategy"] = ray.util.scheduling_strategies.PlacementGroupSchedulingStrategy(
                placement_group=placement_group, placement_group_bundle_index=placement_group_bundle_idx
            )
        if use_gpu and get_ray_resource_name():
            name = get_ray_resource_name()
            if name == "GPU":
                opts["num_gpus"] = num_gpus
            else:
                opts["resources"] = {name: num_gpus}
        return self.create_actor(opts)
