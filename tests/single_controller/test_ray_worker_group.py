"""Worker groups on a real local Ray instance: dispatch modes, futures, meshes, colocation, failures.

One Ray instance with 2 CPUs for the whole module (the small-machine case): the default-sized 2-process
group of ``TestEchoGroup`` takes both CPUs and is released after that class; later groups use fractions.
"""

import os
import signal
import threading
import time

import pytest
import ray  # a hard requirement: a broken install must fail here, not skip
import sc_test_workers
import torch
from sc_test_workers import ActorRole, CriticRole, EchoWorker, EngineGroupWorker

from verl.protocol import DataProto, DataProtoFuture
from verl.single_controller.ray import (
    RayClassWithInitArgs,
    RayResourcePool,
    RayWorkerGroup,
    ResourcePoolManager,
    Role,
    WorkerError,
    create_colocated_worker_cls,
    create_colocated_worker_cls_fused,
)

pytestmark = [pytest.mark.e2e, pytest.mark.own_ray]  # starts Ray in this process


@pytest.fixture(scope="module")
def local_ray():
    from verl.utils.ray_utils import init_local_ray

    ray.cloudpickle.register_pickle_by_value(sc_test_workers)
    init_local_ray(num_cpus=2, namespace="verl_sc_tests")
    yield
    ray.shutdown()


@pytest.fixture(scope="class")
def echo_group(local_ray):
    # verl's default use_gpu=True falls back to CPU bundles when the device seam finds no accelerator
    pool = RayResourcePool([2])
    wg = RayWorkerGroup(pool, RayClassWithInitArgs(EchoWorker, offset=100))
    assert pool.num_cpus_per_process == 1.0 and not pool.use_gpu  # ray.init(num_cpus=2) + 2 processes fit
    yield wg
    pool.remove()


def test_init_local_ray_is_loopback_and_unauthenticated(local_ray):
    assert os.environ["RAY_AUTH_MODE"] == "disabled"
    assert [n["NodeManagerAddress"] for n in ray.nodes()] == ["127.0.0.1"]
    assert ray.cluster_resources()["CPU"] == 2


@pytest.mark.parametrize("address,env,joins", [
    (None, {}, False),
    ("local", {}, False),
    (None, {"RAY_ADDRESS": ""}, False),
    (None, {"RAY_ADDRESS": "local"}, False),
    ("local", {"RAY_ADDRESS": "10.0.0.1:6379"}, False),  # an explicit "local" wins over the env
    ("auto", {}, True),
    ("10.0.0.1:6379", {}, True),
    ("ray://head:10001", {}, True),
    (None, {"RAY_ADDRESS": "10.0.0.1:6379"}, True),
])
def test_joins_existing_cluster(address, env, joins):
    from verl.utils.ray_utils import joins_existing_cluster

    assert joins_existing_cluster(address, env) is joins


def test_init_local_ray_leaves_a_cluster_join_alone(monkeypatch):
    """No Ray started: ``ray.init`` is replaced by a recorder."""
    from verl.utils import ray_utils

    calls = []
    monkeypatch.setattr(ray_utils.ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray_utils.ray, "init", lambda **kw: calls.append(kw))
    monkeypatch.setattr(ray_utils, "_force_loopback", lambda: calls.append("loopback"))
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)

    ray_utils.init_local_ray(address="10.0.0.1:6379")
    assert calls == [{"num_cpus": None, "address": "10.0.0.1:6379", "ignore_reinit_error": True}]
    assert "RAY_AUTH_MODE" not in os.environ

    calls.clear()
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    ray_utils.init_local_ray()
    assert calls == [{"num_cpus": None, "ignore_reinit_error": True}]

    calls.clear()
    monkeypatch.delenv("RAY_ADDRESS")
    ray_utils.init_local_ray(num_cpus=2)
    assert calls[0] == "loopback" and calls[1]["_node_ip_address"] == "127.0.0.1"
    assert calls[1]["include_dashboard"] is False and os.environ["RAY_AUTH_MODE"] == "disabled"


def batch(n: int, **kw) -> DataProto:
    return DataProto.from_dict({"x": torch.arange(float(n))}, **kw)


class TestEchoGroup:
    """Every test here shares one default-sized 2-process group."""

    def test_group_env_threads_and_basic_modes(self, echo_group):
        wg = echo_group
        assert wg.world_size == 2 and len(wg.workers) == 2 and len(wg.worker_names) == 2
        envs = wg.env()
        assert [e["RANK"] for e in envs] == ["0", "1"]
        assert {e["WORLD_SIZE"] for e in envs} == {"2"} and [e["LOCAL_RANK"] for e in envs] == ["0", "1"]
        assert {e["LOCAL_WORLD_SIZE"] for e in envs} == {"2"}
        assert len({(e["MASTER_ADDR"], e["MASTER_PORT"]) for e in envs}) == 1 and envs[0]["MASTER_PORT"].isdigit()
        assert envs[0]["pid"] != envs[1]["pid"]
        # 2 processes sharing (at most) this machine's cores: each one gets its share of threads, >= 1
        assert [e["threads"] for e in envs] == [1, 1], envs  # one core each, not torch's default 2 each

        assert wg.add_rank(1) == [101, 102]  # ONE_TO_ALL
        assert wg.echo(["a", "b"]) == [(0, "a"), (1, "b")]  # ALL_TO_ALL: per-rank lists are split
        assert wg.echo("same") == [(0, "same"), (1, "same")]
        assert wg.whoami() == "rank0"  # RANK_ZERO: one value, from rank 0
        assert wg.one_to_rank_zero(7) == [7, 0]  # Execute.RANK_ZERO
        assert wg.dp_square([3, 4]) == [(0, 9), (1, 16)]  # DP_COMPUTE
        assert ray.get(wg.execute_all("add_rank", 0)) == [100, 101]
        assert wg.execute_all_sync("add_rank", 5) == [105, 106]
        assert wg.execute_rank_zero_sync("add_rank", 5) == 105
        assert ray.get(wg.execute_rank_zero_async("whoami")) == "rank0"
        assert ray.get(wg.execute_all_async("whoami")) == ["rank0", "rank1"]
        with pytest.raises(ValueError, match="DP_COMPUTE expects every argument to be a list of length world_size=2"):
            wg.dp_square([1, 2, 3])


    def test_dp_compute_proto_and_metric(self, echo_group):
        wg = echo_group
        out = wg.double(batch(6))
        assert isinstance(out, DataProto) and len(out) == 6
        assert out.batch["y"].tolist() == [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]
        assert out.batch["rank"].tolist() == [0, 0, 0, 1, 1, 1]  # chunk i went to rank i, concat in rank order
        m = wg.metrics(batch(4))  # DP_COMPUTE_METRIC: one answer per rank, not concatenated
        assert m == [{"rank": 0, "rows": 2, "sum": 1.0}, {"rank": 1, "rows": 2, "sum": 5.0}]

        def plus_rank(worker, data):  # DP_COMPUTE_PROTO_WITH_FUNC: the function runs in each worker
            return DataProto.from_dict({"y": data.batch["x"] + worker.rank})

        out = wg.execute_with_func_generator(plus_rank, batch(4))
        assert out.batch["y"].tolist() == [0.0, 1.0, 3.0, 4.0]


    def test_non_divisible_batch_and_auto_padding(self, echo_group):
        wg = echo_group
        with pytest.raises(ValueError) as info:
            wg.double(batch(5))
        msg = str(info.value)
        assert "double" in msg and "length 5" in msg and "data-parallel size 2" in msg and "auto_padding" in msg
        out = wg.double(batch(5, auto_padding=True))  # padded to 6 for dispatch, unpadded after collect
        assert len(out) == 5 and out.batch["y"].tolist() == [0.0, 2.0, 4.0, 6.0, 8.0]
        fut = wg.double_async(batch(5, auto_padding=True))
        assert isinstance(fut, DataProtoFuture) and len(fut.get()) == 5


    def test_non_blocking_futures_chain(self, echo_group):
        wg = echo_group
        fut = wg.double_async(batch(4))
        assert isinstance(fut, DataProtoFuture)
        out = wg.add_one_to_y(fut)  # future passed straight in: resolved inside the workers
        assert out.batch["z"].tolist() == [1.0, 3.0, 5.0, 7.0] and out.batch["rank"].tolist() == [0, 0, 1, 1]
        refs = wg.slow_value(3)  # blocking=False ONE_TO_ALL: one ObjectRef per rank
        assert isinstance(refs, list) and all(isinstance(r, ray.ObjectRef) for r in refs)
        assert wg.add_rank(refs[1]) == [131, 132]  # an ObjectRef argument is materialized
        assert ray.get(refs) == [30, 31]
        ref = ray.put(batch(4))
        assert wg.double(ref).batch["y"].tolist() == [0.0, 2.0, 4.0, 6.0]  # a ref to a whole batch is split


    def test_dp_mesh_dispatch(self, echo_group):
        wg = echo_group
        out = wg.mesh_tp2(batch(4))  # 1 dp group of tp=2: both get the whole batch, only rank 0 returns
        assert len(out) == 4 and out.batch["rank"].tolist() == [0, 0, 0, 0]
        assert out.batch["y"].tolist() == [0.0, 2.0, 4.0, 6.0]
        out = wg.mesh_rev(batch(4))  # dp rank = reversed rank: rank 1 gets chunk 0, output in dp order
        assert out.batch["rank"].tolist() == [1, 1, 0, 0] and out.batch["y"].tolist() == [0.0, 2.0, 4.0, 6.0]
        assert wg._query_dispatch_info("rev") == [1, 0] and wg._query_collect_info("tp2") == [True, False]


    def test_torch_distributed_all_reduce_over_gloo(self, echo_group):
        assert echo_group.all_reduce(1.5) == [4.5, 4.5]  # 1.5*1 + 1.5*2 on both ranks


    def test_worker_exception_names_rank_and_traceback(self, echo_group):
        with pytest.raises(WorkerError) as info:
            echo_group.fail_on(1)
        msg = str(info.value)
        assert info.value.rank == 1 and "rank 1" in msg and "fail_on" in msg
        assert "deliberate failure in worker rank 1" in msg and "Worker traceback" in msg
        assert "sc_test_workers.py" in msg and ", in fail_on" in msg  # the worker's own frames
        assert echo_group.add_rank(0) == [100, 101]  # the group still works afterwards


def test_killed_worker_fails_pending_call_fast(local_ray):
    pool = RayResourcePool([2], use_gpu=False, num_cpus_per_process=0.5)
    wg = RayWorkerGroup(pool, RayClassWithInitArgs(EchoWorker))
    pid1 = wg.env()[1]["pid"]
    killer = threading.Timer(1.0, os.kill, args=(pid1, signal.SIGKILL))
    start = time.monotonic()
    killer.start()
    try:
        with pytest.raises(WorkerError) as info:
            wg.sleep(120)  # rank 0 keeps sleeping: the call must not wait for it
        elapsed = time.monotonic() - start
    finally:
        killer.cancel()
        pool.remove()
    assert elapsed < 30, elapsed
    assert info.value.rank == 1 and "rank 1" in str(info.value) and "died" in str(info.value)
    assert isinstance(info.value.cause, ray.exceptions.ActorDiedError)


def test_colocated_roles_spawn(local_ray):
    cls = create_colocated_worker_cls(
        {
            "actor": RayClassWithInitArgs(cls=ray.remote(ActorRole), lr=3.0),
            "critic": RayClassWithInitArgs(CriticRole, bias=0.5),
        }
    )
    pool = RayResourcePool([2], use_gpu=False, num_cpus_per_process=0.5)
    wg = RayWorkerGroup(pool, cls)
    try:
        roles = wg.spawn(prefix_set={"actor", "critic"})
        actor, critic = roles["actor"], roles["critic"]
        a, c = actor.info(), critic.info()
        assert [i["role"] for i in a] == ["actor", "actor"] and [i["role"] for i in c] == ["critic", "critic"]
        assert [i["pid"] for i in a] == [i["pid"] for i in c]  # same processes
        assert [i["rank"] for i in a] == [0, 1] and a[0]["lr"] == 3.0 and c[0]["bias"] == 0.5
        out = actor.compute(batch(4))  # same method name on both roles routes to the right instance
        assert out.batch["y"].tolist() == [0.0, 3.0, 6.0, 9.0]
        assert critic.compute(out).batch["v"].tolist() == [0.5, 3.5, 6.5, 9.5]
        assert wg.actor_info()[0]["role"] == "actor"  # prefixed names stay on the parent group
        with pytest.raises(ValueError, match="unknown roles"):
            wg.spawn({"reward"})
    finally:
        pool.remove()


def test_fused_worker(local_ray):
    cls = create_colocated_worker_cls_fused(
        {"actor": RayClassWithInitArgs(ActorRole, lr=2.0), "critic": RayClassWithInitArgs(CriticRole, bias=1.0)}
    )
    pool = RayResourcePool([2], use_gpu=False, num_cpus_per_process=0.5)
    wg = RayWorkerGroup(pool, cls)
    try:
        wg.fuse({"actor", "critic"})
        y = wg.actor.compute(batch(4))
        assert y.batch["y"].tolist() == [0.0, 2.0, 4.0, 6.0] and y.batch["rank"].tolist() == [0, 0, 1, 1]
        assert wg.critic.compute(y).batch["v"].tolist() == [1.0, 3.0, 5.0, 7.0]
        assert [i["pid"] for i in wg.actor.info()] == [i["pid"] for i in wg.critic.info()]
        assert not hasattr(wg, "actor_compute")  # fused: no prefixed methods on the outer group
    finally:
        pool.remove()


def test_split_pools_via_resource_pool_manager(local_ray):
    mgr = ResourcePoolManager(
        resource_pool_spec={"actor_pool": [1], "critic_pool": [1], "rm_pool": [1]},
        mapping={Role.Actor: "actor_pool", Role.Critic: "critic_pool", Role.RewardModel: "rm_pool"},
    )
    mgr.create_resource_pool()  # 3 processes on 2 CPUs: fractional bundles, nothing left pending
    try:
        assert mgr.get_n_gpus() == 2  # CPU cluster: Ray CPU slots count as devices
        assert 0.5 < mgr.get_resource_pool(Role.Critic).num_cpus_per_process <= 2 / 3
        actor = RayWorkerGroup(mgr.get_resource_pool(Role.Actor), RayClassWithInitArgs(ActorRole, lr=10.0))
        critic = RayWorkerGroup(mgr.get_resource_pool(Role.Critic), RayClassWithInitArgs(CriticRole, bias=1.0))
        assert actor.world_size == 1 and critic.world_size == 1
        assert actor.info()[0]["pid"] != critic.info()[0]["pid"]
        v = critic.compute(actor.compute(batch(3)))
        assert v.batch["v"].tolist() == [1.0, 11.0, 21.0]
        with pytest.raises(KeyError, match="RefPolicy"):
            mgr.get_resource_pool(Role.RefPolicy)
    finally:
        for pool in mgr.resource_pool_dict.values():
            pool.remove()
    with pytest.raises(ValueError, match="not in resource_pool_spec"):
        ResourcePoolManager({"a": [1]}, {Role.Actor: "b"}).create_resource_pool()


def test_detached_workers_reattach_by_name(local_ray):
    pool = RayResourcePool([2], use_gpu=False, detached=True, num_cpus_per_process=0.5, name_prefix="detpool")
    cls = RayClassWithInitArgs(cls=ray.remote(EchoWorker), offset=1)  # verl's spelling: a ray.remote class
    wg = RayWorkerGroup(pool, cls, detached=True, name_prefix="det_")
    try:
        assert wg.bump() == [1, 1]
        names = wg.worker_names
        assert all(n.startswith("det_EchoWorker_0:") for n in names)
        del wg
        again = RayWorkerGroup.from_detached(worker_names=names, ray_cls_with_init=cls)
        assert again.world_size == 2 and again.bump() == [2, 2]  # same processes, state kept
        assert again.double(batch(2)).batch["y"].tolist() == [0.0, 2.0]
        with pytest.raises(ValueError, match="no live actor named"):
            RayWorkerGroup.from_detached(worker_names=["det_missing"], ray_cls_with_init=cls)
        again.kill()
    finally:
        pool.remove()


def test_pool_that_cannot_fit_fails_with_resources_named(local_ray):
    pool = RayResourcePool([3], use_gpu=False, num_cpus_per_process=1.0)  # 3 CPUs on a 2-CPU cluster
    with pytest.raises(RuntimeError, match=r"could not reserve 3 bundles of \{CPU=1\}"):
        pool.get_placement_groups()


def test_rollout_engines_dispatch_each_prompt_once_in_order(local_ray):
    """4 workers in engines of 2 (rollout tensor parallel 2): prompts split over the 2 engines only; both ranks of
    an engine run the same request batches (tensor rank 0 leads, the other replays); each prompt is generated
    exactly once and the results come back in prompt order from tensor rank 0 of each engine."""
    pool = RayResourcePool([4], use_gpu=False, num_cpus_per_process=0.5)
    try:
        wg = RayWorkerGroup(pool, RayClassWithInitArgs(EngineGroupWorker, tp=2))
        prompts = DataProto.from_dict({"ids": torch.arange(8).reshape(8, 1)})
        out = wg.generate(prompts)
        assert out.batch["ids"].flatten().tolist() == list(range(8))
        assert out.batch["engine"].tolist() == [0] * 4 + [1] * 4
        assert out.batch["rank"].tolist() == [0] * 4 + [2] * 4
        assert out.batch["same_batches"].tolist() == [1] * 8
        assert wg._query_dispatch_info("rollout") == [0, 0, 1, 1]
    finally:
        pool.remove()
