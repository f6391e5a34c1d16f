"""all_gather_data_proto across two gloo processes: every rank ends with all rows, in rank order."""

import gc
import os
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from verl.protocol import DataProto, all_gather_data_proto


def _worker(rank: int, init_file: str, result_dir: str):
    gc.freeze()  # objects inherited from the parent are never finalized in this thread-less copy
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        data = DataProto.from_dict({"x": torch.full((2, 3), float(rank)), "ids": torch.arange(2) + 10 * rank},
                                   {"tag": [f"r{rank}a", f"r{rank}b"]})
        all_gather_data_proto(data)
        torch.save({"x": data.batch["x"], "ids": data.batch["ids"], "tag": data.non_tensor_batch["tag"].tolist()},
                   os.path.join(result_dir, f"{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.mark.e2e
def test_all_gather_data_proto_two_ranks():
    with tempfile.TemporaryDirectory() as tmp:
        # fork: children reuse the already imported torch (spawn re-imports it, ~20 s per child on 2 cores)
        gc.collect()
        mp.start_processes(_worker, args=(os.path.join(tmp, "init"), tmp), nprocs=2, join=True, start_method="fork")
        for rank in range(2):
            out = torch.load(os.path.join(tmp, f"{rank}.pt"))
            assert out["x"][:, 0].tolist() == [0.0, 0.0, 1.0, 1.0]
            assert out["ids"].tolist() == [0, 1, 10, 11]
            assert out["tag"] == ["r0a", "r0b", "r1a", "r1b"]
