"""CPU accounting on a small machine: ``ray.init(num_cpus=2)`` and a 2-process pool must just work."""

import os

import pytest
import torch

ray = pytest.importorskip("ray")

import sc_test_workers  # noqa: E402
from sc_test_workers import EchoWorker  # noqa: E402

from verl.protocol import DataProto  # noqa: E402
from verl.single_controller.ray import (  # noqa: E402
    RayClassWithInitArgs,
    RayResourcePool,
    RayWorkerGroup,
    ResourcePoolManager,
    Role,
)

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def two_cpu_ray():
    from verl.utils.ray_utils import init_local_ray

    ray.cloudpickle.register_pickle_by_value(sc_test_workers)
    ctx = init_local_ray(num_cpus=2)
    yield ctx
    ray.shutdown()


def test_init_local_ray_is_loopback_and_unauthenticated(two_cpu_ray):
    assert os.environ["RAY_AUTH_MODE"] == "disabled"
    assert [n["NodeManagerAddress"] for n in ray.nodes()] == ["127.0.0.1"]
    assert ray.cluster_resources()["CPU"] == 2


def test_two_process_pool_on_two_cpus(two_cpu_ray):
    # verl's default use_gpu=True falls back to CPU bundles when the device seam finds no accelerator
    pool = RayResourcePool([2])
    wg = RayWorkerGroup(pool, RayClassWithInitArgs(EchoWorker))
    try:
        assert pool.num_cpus_per_process == 1.0 and not pool.use_gpu
        envs = wg.env()
        assert [e["threads"] for e in envs] == [1, 1]  # one core each, not torch's default of 2 each
        out = wg.double(DataProto.from_dict({"x": torch.arange(4.0)}))
        assert out.batch["y"].tolist() == [0.0, 2.0, 4.0, 6.0]
        assert wg.all_reduce(1.0) == [3.0, 3.0]
    finally:
        pool.remove()


def test_resource_pool_manager_shares_cpus_over_all_pools(two_cpu_ray):
    mgr = ResourcePoolManager(
        resource_pool_spec={"global_pool": [2], "reward_pool": [1]},
        mapping={Role.ActorRollout: "global_pool", Role.Critic: "global_pool", Role.RewardModel: "reward_pool"},
    )
    mgr.create_resource_pool()  # 3 processes on 2 CPUs: fractional bundles, nothing left pending
    try:
        share = mgr.get_resource_pool(Role.Critic).num_cpus_per_process
        assert 0.5 < share < 2 / 3 + 1e-6
        assert mgr.get_resource_pool(Role.ActorRollout) is mgr.get_resource_pool(Role.Critic)
        wg = RayWorkerGroup(mgr.get_resource_pool(Role.RewardModel), RayClassWithInitArgs(EchoWorker))
        assert wg.env()[0]["threads"] == 1 and wg.world_size == 1
    finally:
        for pool in mgr.resource_pool_dict.values():
            pool.remove()
