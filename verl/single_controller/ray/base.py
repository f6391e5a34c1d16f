"""Ray backend of the single controller: worker groups as sets of Ray actors, and role -> pool mapping.

``RayWorkerGroup(resource_pool, RayClassWithInitArgs(MyWorker, ...))`` starts one actor per bundle of
the pool, with RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT / LOCAL_RANK / LOCAL_WORLD_SIZE and a thread
count in its environment, then binds every ``@register`` method of ``MyWorker`` onto the group.

Extra per-worker environment variables go in with ``RayWorkerGroup(..., worker_env={"KEY": "value"})``;
the variables the group sets itself (RANK, MASTER_PORT ...) cannot be overridden that way (ValueError).
``master_addr=`` and ``master_port=`` (both or neither) fix rank 0's rendezvous address instead.

Failures: a blocking call waits on all workers but returns at the first failure, raising
``WorkerError`` naming the group, rank, actor and method, with the worker's own traceback (or Ray's
ActorDiedError text when the process died) in the message.

``Role`` lives in :mod:`verl.trainer.ppo.utils` (as in verl); this module still answers ``Role`` for older
imports, resolving it on first use so that importing the single controller never imports the trainer.
"""

from __future__ import annotations

import importlib
import random
import secrets
import string
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import ray

from verl.protocol import WorkerError
from verl.single_controller.base import WorkerGroup
from verl.single_controller.base.worker import ENV_NUM_THREADS
from verl.single_controller.base.worker_group import _unwrap_cls, func_generator  # noqa: F401 (verl's name)
from verl.single_controller.ray.colocate import (
    FusedWorkerCLSName,
    create_colocated_worker_cls,
    create_colocated_worker_cls_fused,
    create_colocated_worker_raw_cls,
)
from verl.single_controller.ray.resource import (
    RayClassWithInitArgs,
    RayResourcePool,
    SubRayResourcePool,
    extract_pg_from_exist,
    merge_resource_pool,
    node_cores,
    node_id_of_bundle,
    pick_master_addr_port,
    sort_placement_group_by_node_ip,
    split_resource_pool,
)
from verl.utils.device import get_ray_resource_name

if TYPE_CHECKING:
    from verl.trainer.ppo.utils import Role

__all__ = [
    "FusedWorkerCLSName",
    "RayClassWithInitArgs",
    "RayResourcePool",
    "RayWorkerGroup",
    "ResourcePoolManager",
    "SubRayResourcePool",
    "WorkerError",
    "create_colocated_worker_cls",
    "create_colocated_worker_cls_fused",
    "create_colocated_worker_raw_cls",
    "extract_pg_from_exist",
    "get_random_string",
    "merge_resource_pool",
    "sort_placement_group_by_node_ip",
    "split_resource_pool",
]

# Set by the group for every worker; ``worker_env`` may add variables but not replace these.
PROTECTED_WORKER_ENV = frozenset({"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                                  "WG_PREFIX", "WG_BACKEND", "RAY_LOCAL_RANK", "RAY_LOCAL_WORLD_SIZE"})


def __getattr__(name: str):
    # ``Role`` moved to verl.trainer.ppo.utils; resolved lazily so this module never imports the trainer.
    if name == "Role":
        return importlib.import_module("verl.trainer.ppo.utils").Role
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def get_random_string(length: int) -> str:
    """``length`` random ASCII letters and digits (verl's default worker-name prefix)."""
    alphabet = string.ascii_letters + string.digits
    return "".join(random.choice(alphabet) for _ in range(length))


def _check_worker_env(worker_env) -> dict[str, str]:
    if worker_env is None:
        return {}
    if not isinstance(worker_env, dict):
        raise TypeError(f"worker_env must be a dict of environment variables, got {type(worker_env).__name__}")
    clash = sorted(PROTECTED_WORKER_ENV & set(worker_env))
    if clash:
        raise ValueError(f"Cannot override protected system env: {clash}. The worker group sets these itself; "
                         f"pass other variable names in worker_env")
    return {str(k): str(v) for k, v in worker_env.items()}


class RayWorkerGroup(WorkerGroup):
    """A group of Ray actors running one worker class, driven as a single object."""

    def __init__(
        self,
        resource_pool: RayResourcePool | None = None,
        ray_cls_with_init: RayClassWithInitArgs | None = None,
        bin_pack: bool = True,
        name_prefix: str | None = None,
        detached: bool = False,
        worker_names: list[str] | None = None,
        worker_handles: list | None = None,
        ray_wait_register_center_timeout: int = 300,
        **kwargs,
    ) -> None:
        worker_env = _check_worker_env(kwargs.pop("worker_env", None))
        fixed_master = (kwargs.pop("master_addr", None), kwargs.pop("master_port", None))
        if (fixed_master[0] is None) != (fixed_master[1] is None):
            raise ValueError("Both 'master_addr' and 'master_port' must be provided if you intend to manually specify "
                             "them, or neither should be provided to let the group pick rank 0's node and a free port")
        super().__init__(resource_pool=resource_pool, **kwargs)
        self.customized_worker_env = worker_env
        if ray_cls_with_init is None:
            raise ValueError("RayWorkerGroup needs ray_cls_with_init=RayClassWithInitArgs(MyWorker, ...)")
        self.ray_cls_with_init = ray_cls_with_init
        self.name_prefix = name_prefix if name_prefix is not None else secrets.token_hex(4) + "_"
        self._detached = detached
        self.wg_dict = None
        self.fused_worker_used = bool(getattr(ray_cls_with_init, "fused_worker_used", False))
        self.resource_pool = resource_pool
        if worker_names is not None or worker_handles is not None:
            self._init_with_detached_workers(worker_names, worker_handles)
        elif resource_pool is not None:
            self._init_with_resource_pool(resource_pool, ray_cls_with_init, bin_pack, detached, fixed_master)
        else:
            raise ValueError("RayWorkerGroup needs a resource_pool, or worker_names/worker_handles to re-attach")
        self.method_names = self._bind_worker_method(ray_cls_with_init.cls)

    # -- construction ------------------------------------------------------------------------
    def _init_with_resource_pool(self, resource_pool, ray_cls_with_init, bin_pack, detached, fixed_master=(None, None)):
        pgs = resource_pool.get_placement_groups(strategy="STRICT_PACK" if bin_pack else "PACK")
        world_size = resource_pool.world_size
        if fixed_master[0] is not None:
            master_addr, master_port = str(fixed_master[0]), str(fixed_master[1])
        else:
            master_addr, master_port = pick_master_addr_port(pgs[0], 0)
        self._master_addr, self._master_port = master_addr, master_port
        cls_name = _unwrap_cls(ray_cls_with_init.cls).__name__
        cpu_per_actor = resource_pool.num_cpus_per_process / resource_pool.max_colocate_count
        accel = resource_pool.accelerator_resource
        rank = 0
        for pg_idx, (pg, local_world_size) in enumerate(zip(pgs, resource_pool.store)):
            threads = resource_pool.thread_share(node_cores(node_id_of_bundle(pg, 0)), local_world_size)
            for local_rank in range(local_world_size):
                env = {
                    "RANK": str(rank),
                    "WORLD_SIZE": str(world_size),
                    "LOCAL_RANK": str(local_rank),
                    "LOCAL_WORLD_SIZE": str(local_world_size),
                    "MASTER_ADDR": master_addr,
                    "MASTER_PORT": master_port,
                    "WG_PREFIX": self.name_prefix,
                    "WG_BACKEND": "ray",
                    "RAY_LOCAL_RANK": str(local_rank),
                    "RAY_LOCAL_WORLD_SIZE": str(local_world_size),
                    ENV_NUM_THREADS: str(threads),
                    "OMP_NUM_THREADS": str(threads),
                    **self.customized_worker_env,
                }
                name = f"{self.name_prefix}{cls_name}_{pg_idx}:{local_rank}"
                options = {
                    "scheduling_strategy": ray.util.scheduling_strategies.PlacementGroupSchedulingStrategy(
                        placement_group=pg, placement_group_bundle_index=local_rank
                    ),
                    "num_cpus": cpu_per_actor,
                    "name": name,
                }
                if accel == "GPU":
                    options["num_gpus"] = 1 / resource_pool.max_colocate_count
                elif accel:
                    options["resources"] = {accel: 1 / resource_pool.max_colocate_count}
                if detached:
                    options["lifetime"] = "detached"
                self._workers.append(ray_cls_with_init.create_actor(options, env))
                self._worker_names.append(name)
                rank += 1
        # Surface constructor errors here, naming the rank, rather than at the first method call.
        self._wait_outputs([w.__ray_ready__.remote() for w in self._workers], "__init__")

    def _init_with_detached_workers(self, worker_names, worker_handles):
        if worker_handles is None:
            handles = []
            for name in worker_names:
                try:
                    handles.append(ray.get_actor(name))
                except ValueError as err:
                    raise ValueError(
                        f"no live actor named {name!r} in Ray namespace {ray.get_runtime_context().namespace!r}; "
                        f"detached workers are found by name only from the namespace that created them "
                        f"(ray.init(namespace=...))"
                    ) from err
            worker_handles = handles
        self._workers = list(worker_handles)
        self._worker_names = list(worker_names) if worker_names is not None else [None] * len(self._workers)

    @classmethod
    def from_detached(
        cls,
        name_prefix: str | None = None,
        worker_names: list[str] | None = None,
        worker_handles: list | None = None,
        ray_cls_with_init: RayClassWithInitArgs | None = None,
        **kwargs,
    ) -> "RayWorkerGroup":
        """Re-attach to running workers (e.g. detached ones started by an earlier driver) by name."""
        if worker_names is None and worker_handles is None:
            raise ValueError("from_detached needs worker_names (see wg.worker_names) or worker_handles")
        return cls(
            resource_pool=None,
            ray_cls_with_init=ray_cls_with_init,
            name_prefix=name_prefix,
            worker_names=worker_names,
            worker_handles=worker_handles,
            **kwargs,
        )

    # -- colocated roles --------------------------------------------------------------------
    def spawn(self, prefix_set) -> dict[str, "RayWorkerGroup"]:
        """One worker group per role, sharing these workers (see ``create_colocated_worker_cls``)."""
        cls = _unwrap_cls(self.ray_cls_with_init.cls)
        fused = getattr(cls, "_verl_fused_roles", None)
        roles = fused if fused is not None else getattr(cls, "_verl_colocated_roles", None)
        if roles is None:
            raise ValueError(
                f"spawn() needs a worker class built by create_colocated_worker_cls(_fused); {cls.__name__} is not"
            )
        unknown = sorted(set(prefix_set) - set(roles))
        if unknown:
            raise ValueError(f"spawn({sorted(prefix_set)}): unknown roles {unknown}; this group has {sorted(roles)}")
        out = {}
        for role in prefix_set:
            if fused is not None:
                wg = self._sub_group(RayClassWithInitArgs(roles[role]))
                wg.fused_worker_used = True
                wg.sub_cls_name = role
                wg.method_names = []  # every call goes through FusedWorker._fuw_execute
                wg._bind_worker_method(roles[role])
            else:
                wg = self._sub_group(self.ray_cls_with_init)
                wg.method_names = wg._bind_worker_method(cls)
                for name in cls._verl_role_methods[role]:
                    setattr(wg, name, getattr(wg, f"{role}_{name}"))
            out[role] = wg
        return out

    def fuse(self, prefix_set) -> dict[str, "RayWorkerGroup"]:
        """Attach one group per role as an attribute (``wg.actor``, ``wg.critic``) and return them."""
        if self.wg_dict is None:
            self.wg_dict = self.spawn(prefix_set)
        for role, wg in self.wg_dict.items():
            setattr(self, role, wg)
        return self.wg_dict

    def _sub_group(self, ray_cls_with_init) -> "RayWorkerGroup":
        wg = RayWorkerGroup.__new__(RayWorkerGroup)
        WorkerGroup.__init__(wg, resource_pool=None)
        wg.ray_cls_with_init = ray_cls_with_init
        wg.name_prefix = self.name_prefix
        wg._detached = self._detached
        wg.wg_dict = None
        wg.customized_worker_env = self.customized_worker_env
        wg.resource_pool = self.resource_pool
        wg._workers = list(self._workers)
        wg._worker_names = list(self._worker_names)
        wg._master_addr, wg._master_port = self._master_addr, self._master_port
        return wg

    # -- execution --------------------------------------------------------------------------
    def _execute_remote_single_worker(self, worker, method_name: str, *args, **kwargs):
        if self.fused_worker_used and method_name not in self.method_names:
            return getattr(worker, self.fused_worker_execute_fn_name).remote(
                self.sub_cls_name, method_name, *args, **kwargs
            )
        return getattr(worker, method_name).remote(*args, **kwargs)

    def execute_rank_zero_async(self, method_name: str, *args, **kwargs):
        return self._execute_remote_single_worker(self._workers[0], method_name, *args, **kwargs)

    def execute_rank_zero_sync(self, method_name: str, *args, **kwargs):
        return self._wait_outputs(self.execute_rank_zero_async(method_name, *args, **kwargs), method_name)

    def execute_rank_zero(self, method_name: str, *args, **kwargs):
        return self.execute_rank_zero_async(method_name, *args, **kwargs)

    def execute_all(self, method_name: str, *args, **kwargs):
        return self.execute_all_async(method_name, *args, **kwargs)

    def execute_all_sync(self, method_name: str, *args, **kwargs):
        return self._wait_outputs(self.execute_all_async(method_name, *args, **kwargs), method_name)

    def execute_all_async(self, method_name: str, *args, **kwargs) -> list:
        """Call ``method_name`` on every worker; returns one ObjectRef per rank.

        If every argument is a list of length world_size, worker i gets element i of each (this is
        how dispatch functions hand out per-rank arguments); otherwise all workers get the same ones.
        """
        n = len(self._workers)
        per_rank = bool(args or kwargs) and all(isinstance(a, list) and len(a) == n for a in args) and all(
            isinstance(v, list) and len(v) == n for v in kwargs.values()
        )
        if per_rank:
            return [
                self._execute_remote_single_worker(
                    w, method_name, *(a[i] for a in args), **{k: v[i] for k, v in kwargs.items()}
                )
                for i, w in enumerate(self._workers)
            ]
        return [self._execute_remote_single_worker(w, method_name, *args, **kwargs) for w in self._workers]

    def _wait_outputs(self, output, method_name: str):
        """``ray.get`` that returns at the first failing worker instead of waiting for all of them."""
        single = isinstance(output, ray.ObjectRef)
        refs = [output] if single else output
        if not isinstance(refs, list) or not refs or not all(isinstance(r, ray.ObjectRef) for r in refs):
            return output
        rank_of = {r: i for i, r in enumerate(refs)}
        values = {}
        pending = list(refs)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            if pending:
                more, pending = ray.wait(pending, num_returns=len(pending), timeout=0)
                ready += more
            try:
                got = ray.get(ready)
            except Exception:
                for r in ready:  # find which rank failed
                    try:
                        values[r] = ray.get(r)
                    except Exception as err:
                        raise self._worker_error(rank_of[r], method_name, err) from err
                raise
            values.update(zip(ready, got))
        result = [values[r] for r in refs]
        return result[0] if single else result

    def _worker_error(self, rank: int, method_name: str, err: BaseException) -> WorkerError:
        name = self._worker_names[rank] if rank < len(self._worker_names) else None
        what = "died" if isinstance(err, ray.exceptions.ActorDiedError) else "raised"
        role = self._role_of(method_name)
        msg = (
            f"{self._describe()}: role {role!r} rank {rank} (actor {name!r}) {what} during {method_name}() "
            f"[world_size={self.world_size}]. Worker traceback / Ray error:\n{type(err).__name__}: {err}"
        )
        error = WorkerError(msg, rank=rank, cause=err)
        error.role = role
        return error

    def _role_of(self, method_name: str) -> str:
        """The role a call ran for: the sub-group's role, the ``{role}_`` prefix of a colocated method, or the
        worker class name."""
        cls = _unwrap_cls(self.ray_cls_with_init.cls)
        if self.sub_cls_name:
            return self.sub_cls_name
        roles = getattr(cls, "_verl_colocated_roles", None) or getattr(cls, "_verl_fused_roles", None) or {}
        for role in sorted(roles, key=len, reverse=True):
            if method_name.startswith(f"{role}_"):
                return role
        return cls.__name__

    def _describe(self) -> str:
        cls = _unwrap_cls(self.ray_cls_with_init.cls).__name__
        role = f"[{self.sub_cls_name}]" if self.sub_cls_name else ""
        return f"RayWorkerGroup({cls}{role}, prefix={self.name_prefix!r})"

    # -- properties ---------------------------------------------------------------------------
    @property
    def worker_names(self) -> list[str]:
        return self._worker_names

    @property
    def workers(self) -> list:
        return self._workers

    @property
    def master_address(self):
        return self._master_addr

    @property
    def master_port(self):
        return self._master_port

    def kill(self) -> None:
        """Kill this group's actors (detached ones included); the resource pool stays reserved."""
        for w in self._workers:
            try:
                ray.kill(w)
            except Exception:
                pass


@dataclass
class ResourcePoolManager:
    """Named resource pools (``{"global_pool": [n_per_node] * nnodes}``) and which role runs in which.

    ``create_resource_pool()`` checks the cluster can host every pool (clear error otherwise), splits
    the free CPUs among all processes of all pools (each gets at most its share of real cores), and
    reserves the placement groups.
    """

    resource_pool_spec: dict[str, list[int]]
    mapping: dict[Role, str]
    max_colocate_count: int = 3
    resource_pool_dict: dict[str, RayResourcePool] = field(default_factory=dict)

    def create_resource_pool(self) -> None:
        self._check_spec()
        self._check_resource_available()
        cpus = self._cpus_per_process()  # once, before any pool takes its share
        for name, process_on_nodes in self.resource_pool_spec.items():
            pool = RayResourcePool(
                process_on_nodes=list(process_on_nodes),
                use_gpu=True,
                max_colocate_count=self.max_colocate_count,
                name_prefix=name,
                num_cpus_per_process=cpus,
            )
            pool.get_placement_groups()
            self.resource_pool_dict[name] = pool

    def _check_spec(self) -> None:
        for role, pool in self.mapping.items():
            if pool not in self.resource_pool_spec:
                raise ValueError(
                    f"ResourcePoolManager: role {getattr(role, 'name', role)} maps to pool {pool!r}, which is not "
                    f"in resource_pool_spec (pools: {sorted(self.resource_pool_spec)})"
                )
        for name, nodes in self.resource_pool_spec.items():
            if not nodes or any(not isinstance(n, int) or n < 1 for n in nodes):
                raise ValueError(f"resource_pool_spec[{name!r}]={nodes}: use a list of positive process counts")

    def _procs_per_node(self) -> int:
        width = max(len(v) for v in self.resource_pool_spec.values())
        return max(sum(v[i] for v in self.resource_pool_spec.values() if i < len(v)) for i in range(width))

    def _cpus_per_process(self) -> float:
        free = float(ray.available_resources().get("CPU", 0.0))
        total = sum(sum(v) for v in self.resource_pool_spec.values())
        per_node = self._procs_per_node()
        cap = max(1.0, node_cores(None) // per_node)
        return max(0.001, min(free / total, cap) * 0.999)

    def get_resource_pool(self, role: Role) -> RayResourcePool:
        if role not in self.mapping:
            raise KeyError(f"role {getattr(role, 'name', role)} has no pool in mapping {list(self.mapping)}")
        name = self.mapping[role]
        if name not in self.resource_pool_dict:
            raise KeyError(f"pool {name!r} does not exist yet; call create_resource_pool() first")
        return self.resource_pool_dict[name]

    def get_n_gpus(self) -> int:
        """Accelerators in the cluster, or Ray CPU slots when there are none (a CPU process = a device)."""
        res = ray.cluster_resources()
        accel = get_ray_resource_name()
        return int(res.get(accel, 0)) if accel else int(res.get("CPU", 0))

    def _check_resource_available(self) -> None:
        accel = get_ray_resource_name()
        needed = sum(sum(v) for v in self.resource_pool_spec.values())
        if accel is None:
            free = float(ray.available_resources().get("CPU", 0.0))
            if free < 0.001 * needed:
                raise ValueError(
                    f"ResourcePoolManager: pools {self.resource_pool_spec} need {needed} worker processes but the "
                    f"Ray cluster has {free:g} free CPUs; start Ray with more CPUs (ray.init(num_cpus=...))"
                )
            return
        per_node = [
            int(n["Resources"].get(accel, 0)) for n in ray.nodes() if n.get("Alive", True) and accel in n["Resources"]
        ]
        total = sum(per_node)
        if needed > total:
            raise ValueError(
                f"ResourcePoolManager: pools {self.resource_pool_spec} need {needed} {accel}s but the cluster has "
                f"{total} ({per_node} per node); lower trainer.n_gpus_per_node / trainer.nnodes"
            )
        biggest = max(per_node) if per_node else 0
        for name, nodes in self.resource_pool_spec.items():
            if max(nodes) > biggest:
                raise ValueError(
                    f"ResourcePoolManager: pool {name!r} wants {max(nodes)} {accel}s on one node, but the largest "
                    f"node has {biggest}; lower trainer.n_gpus_per_node"
                )
