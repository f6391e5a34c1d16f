"""DataProto through Ray's object store, and DataProtoFuture resolving real worker results."""

import numpy as np
import pytest
import ray  # a hard requirement: a broken install must fail here, not skip
import torch

from verl.protocol import DataProto, DataProtoFuture


@pytest.fixture(scope="module")
def local_ray():
    from verl.utils.ray_utils import init_local_ray

    init_local_ray(num_cpus=2)
    yield
    ray.shutdown()


pytestmark = pytest.mark.own_ray  # starts Ray in this process


@pytest.mark.e2e
def test_put_get_round_trip_and_future(local_ray):
    data = DataProto.from_dict({"x": torch.arange(8.0)}, {"label": [f"s{i}" for i in range(8)]},
                               meta_info={"temperature": 0.5, "nested": {"a": [1, 2]}})
    back = ray.get(ray.put(data))
    assert torch.equal(back.batch["x"], data.batch["x"]) and back.meta_info == data.meta_info
    assert back.non_tensor_batch["label"].tolist() == data.non_tensor_batch["label"].tolist()

    def double_scores(data: DataProto) -> DataProto:  # defined here so Ray pickles it by value
        return DataProto.from_dict({"score": data.batch["x"] * 2}, {"label": list(data.non_tensor_batch["label"])},
                                   meta_info={"metrics": {"n": [len(data)]}})

    remote = ray.remote(double_scores)
    refs = [remote.remote(chunk) for chunk in data.chunk(2)]
    future = DataProtoFuture.concat(refs)
    out = future.get()
    assert out.batch["score"].tolist() == [2.0 * i for i in range(8)]
    assert out.non_tensor_batch["label"].tolist() == [f"s{i}" for i in range(8)]
    assert out.meta_info["metrics"] == {"n": [4, 4]}

    second = future.chunk(4)[1].get()  # lazily selects rows 2..3 of the collected result
    assert second.batch["score"].tolist() == [4.0, 6.0]
    assert np.array_equal(second.non_tensor_batch["label"], np.array(["s2", "s3"], dtype=object))


@pytest.mark.e2e
def test_future_failure_names_the_failed_rank(local_ray):
    import time

    from verl.single_controller.ray import WorkerError

    def work(data: DataProto, fail: bool, sleep_s: float = 0.0) -> DataProto:
        time.sleep(sleep_s)
        if fail:
            raise ValueError(f"deliberate failure on {len(data)} rows")
        return data

    remote = ray.remote(num_cpus=0)(work)
    chunks = DataProto.from_dict({"x": torch.arange(6.0)}).chunk(3)
    refs = [remote.remote(chunks[0], False), remote.remote(chunks[1], True), remote.remote(chunks[2], False)]
    with pytest.raises(WorkerError) as info:
        DataProtoFuture.concat(refs).get()
    assert info.value.rank == 1 and "rank 1 of 3 raised" in str(info.value)
    assert "deliberate failure on 2 rows" in str(info.value)
    assert isinstance(info.value.cause, ray.exceptions.RayTaskError)

    # a slow healthy rank 0 is not waited for once rank 1 has failed
    refs = [remote.remote(chunks[0], False, 60.0), remote.remote(chunks[1], True)]
    start = time.monotonic()
    with pytest.raises(WorkerError) as info:
        DataProtoFuture.concat(refs).chunk(2)[0].get()
    assert info.value.rank == 1 and time.monotonic() - start < 30
    ray.cancel(refs[0], force=True)
