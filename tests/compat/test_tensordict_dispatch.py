"""TensorDict-based dispatch: DP_COMPUTE_PROTO-style modes split TensorDict arguments across ranks (jagged
tensors and per-row objects included), pad with auto padding, and concatenate TensorDict results. The worker
group is a stand-in object (this is pure dispatch logic; the Ray path is covered in tests/single_controller)."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from verl.protocol import DataProtoConfig
from verl.single_controller.base.decorator import (
    _PADDING_SIZE_KEY,
    collect_dp_compute_data_proto,
    dispatch_dp_compute_data_proto,
)
from verl.single_controller.base.worker_group import _unpad_output
from verl.utils import tensordict_utils as tu


class Group:
    world_size = 2


def batch(n: int) -> TensorDict:
    rows = [torch.arange(i + 1) for i in range(n)]
    return tu.get_tensordict({"x": torch.arange(n), "ragged": torch.nested.as_nested_tensor(rows, layout=torch.jagged),
                              "label": [f"r{i}" for i in range(n)]}, {"temperature": 0.5})


def test_tensordict_argument_is_split_per_rank_and_results_concatenated():
    args, kwargs = dispatch_dp_compute_data_proto(Group(), batch(4), extra=batch(4))
    (parts,), extra = args, kwargs["extra"]
    assert [p["x"].tolist() for p in parts] == [[0, 1], [2, 3]] and len(extra) == 2
    assert [tu.get(p, "label") for p in parts] == [["r0", "r1"], ["r2", "r3"]]
    assert [[r.tolist() for r in p["ragged"].unbind()] for p in parts][1] == [[0, 1, 2], [0, 1, 2, 3]]
    assert all(tu.get(p, "temperature") == 0.5 for p in parts)
    merged = collect_dp_compute_data_proto(Group(), parts)
    tu.assert_tensordict_eq(merged, batch(4))


def test_indivisible_tensordict_is_refused_or_padded_and_unpadded():
    with pytest.raises(Exception, match="not divisible by the data-parallel size 2"):
        dispatch_dp_compute_data_proto(Group(), batch(3))
    DataProtoConfig.auto_padding = True
    try:
        (parts,), kwargs = dispatch_dp_compute_data_proto(Group(), batch(3))
    finally:
        DataProtoConfig.auto_padding = False
    assert kwargs[_PADDING_SIZE_KEY] == 1 and [p["x"].tolist() for p in parts] == [[0, 1], [2, 0]]
    out = _unpad_output(collect_dp_compute_data_proto(Group(), parts), kwargs[_PADDING_SIZE_KEY])
    tu.assert_tensordict_eq(out, batch(3))


def test_chunk_tensordict_needs_an_even_split():
    assert [len(c) for c in tu.chunk_tensordict(batch(6), 3)] == [2, 2, 2]
    with pytest.raises(ValueError, match="5 rows into 2 equal chunks"):
        tu.chunk_tensordict(batch(5), 2)
