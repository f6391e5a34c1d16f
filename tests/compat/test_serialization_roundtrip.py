"""DataProto and TensorDict serialisation round trips are bit-exact: every dtype (bf16, float8, bool, int),
NaN payloads, views, empty batches, nested (jagged) tensors, per-row Python objects and batch-level values."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from tensordict import NonTensorData, NonTensorStack, TensorDict

from verl.protocol import (
    DataProto,
    deserialize_single_tensor,
    deserialize_tensordict,
    serialize_single_tensor,
    serialize_tensordict,
)
from verl.utils import tensordict_utils as tu

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int8,
          torch.uint8, torch.bool, torch.float8_e4m3fn]


def bits(t: torch.Tensor) -> bytes:
    """The raw bytes of a tensor (NaN payloads and -0.0 included), for bit-exact comparison."""
    return t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def assert_same_tensor(a: torch.Tensor, b: torch.Tensor):
    assert a.dtype == b.dtype and a.shape == b.shape
    assert bits(a) == bits(b)


def sample(dtype: torch.dtype, shape=(3, 5)) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    if dtype is torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if dtype.is_floating_point:
        x = torch.randn(shape, generator=g) * 7
        x.view(-1)[0] = float("nan")
        x.view(-1)[1] = -0.0
        return x.to(dtype)
    info = torch.iinfo(dtype)
    return torch.randint(max(info.min, -1000), min(info.max, 1000), shape, generator=g).to(dtype)


def object_column() -> np.ndarray:
    """Per-row objects of every awkward kind: empty and ragged lists, dicts, None, strings, arrays."""
    col = np.empty(4, dtype=object)
    col[0] = []
    col[1] = [0.5, [1, 2], {"acc": 1.0}]
    col[2] = {"role": "user", "content": "2+2?", "nested": {"k": [None]}}
    col[3] = np.arange(3)
    return col


def assert_same_objects(a: np.ndarray, b: np.ndarray):
    assert a.dtype == object and b.dtype == object and a.shape == b.shape
    for x, y in zip(a, b):
        if isinstance(x, np.ndarray):
            assert isinstance(y, np.ndarray) and x.dtype == y.dtype and np.array_equal(x, y)
        else:
            assert type(x) is type(y) and x == y


def assert_same_proto(a: DataProto, b: DataProto):
    assert len(a) == len(b)
    if a.batch is None:
        assert b.batch is None
    else:
        assert set(a.batch.keys()) == set(b.batch.keys()) and tuple(a.batch.batch_size) == tuple(b.batch.batch_size)
        for key in a.batch.keys():
            assert_same_tensor(a.batch[key], b.batch[key])
    assert set(a.non_tensor_batch) == set(b.non_tensor_batch)
    for key in a.non_tensor_batch:
        assert_same_objects(a.non_tensor_batch[key], b.non_tensor_batch[key])
    assert a.meta_info.keys() == b.meta_info.keys()


# ------------------------------------------------------------------------------------------- single tensors
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_single_tensor_round_trip_is_bit_exact(dtype):
    x = sample(dtype)
    enc = serialize_single_tensor(x)
    assert enc[0] == str(dtype).removeprefix("torch.") and enc[1] == (3, 5) and enc[2].dtype == np.uint8
    back = deserialize_single_tensor(pickle.loads(pickle.dumps(enc)))
    assert_same_tensor(back, x)
    back.add_(1) if dtype not in (torch.bool, torch.float8_e4m3fn) else None  # owns its memory: no aliasing
    assert bits(x) == bits(sample(dtype))


@pytest.mark.parametrize("shape", [(0,), (0, 7), (), (2, 0, 3)], ids=str)
def test_single_tensor_empty_and_scalar_shapes(shape):
    x = torch.arange(int(np.prod(shape)), dtype=torch.float32).reshape(shape)
    assert_same_tensor(deserialize_single_tensor(serialize_single_tensor(x)), x)


def test_single_tensor_of_a_strided_view_keeps_only_the_view():
    base = torch.arange(40, dtype=torch.int64).reshape(8, 5)
    view = base[1::3, ::2]  # non-contiguous
    enc = serialize_single_tensor(view)
    assert enc[2].nbytes == view.numel() * 8
    assert torch.equal(deserialize_single_tensor(enc), view)


def test_unknown_dtype_in_payload_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown torch dtype 'float128'"):
        deserialize_single_tensor(("float128", (1,), np.zeros(16, dtype=np.uint8)))


# ---------------------------------------------------------------------------------------------- TensorDicts
def full_tensordict() -> TensorDict:
    rows = [torch.arange(n, dtype=torch.int64) * 3 for n in (2, 5, 1, 3)]
    return tu.get_tensordict(
        {
            "input_ids": sample(torch.int64, (4, 6)),
            "logp": sample(torch.bfloat16, (4, 6)),
            "mask": sample(torch.bool, (4, 6)),
            "jagged": torch.nested.as_nested_tensor(rows, layout=torch.jagged),
            "turn_scores": [[], [0.5, 0.8], [0.9], [float("inf")]],
            "messages": [[{"role": "user", "content": "hi"}], [], [{"role": "tool"}], [None]],
        },
        non_tensor_dict={"temperature": 0.7, "eos_token_id": [2, 7], "tag": "exp-1"},
    )


def assert_same_tensordict(a: TensorDict, b: TensorDict):
    assert tuple(a.batch_size) == tuple(b.batch_size) and set(a.keys()) == set(b.keys())
    for key in a.keys():
        x, y = a.get(key), b.get(key)
        assert type(x) is type(y), key
        if isinstance(x, torch.Tensor) and x.is_nested:
            assert y.is_nested and x.layout == y.layout
            rows_x, rows_y = x.unbind(), y.unbind()
            assert len(rows_x) == len(rows_y)
            for r1, r2 in zip(rows_x, rows_y):
                assert_same_tensor(r1, r2)
        elif isinstance(x, torch.Tensor):
            assert_same_tensor(x, y)
        else:
            assert tu.get(a, key) == tu.get(b, key), key


def test_tensordict_round_trip_with_nested_tensors_and_objects():
    td = full_tensordict()
    enc = serialize_tensordict(td)
    assert enc[0] == (4,) and enc[1] is None
    assert len(enc[2]["jagged"]) == 2 and enc[2]["jagged"][0] == "jagged"  # (layout, rows), as verl writes it
    assert len(enc[2]["input_ids"]) == 3  # (dtype, shape, bytes)
    back = deserialize_tensordict(pickle.loads(pickle.dumps(enc)))
    assert_same_tensordict(td, back)
    assert tu.get(back, "turn_scores") == [[], [0.5, 0.8], [0.9], [float("inf")]]
    assert tu.get(back, "eos_token_id") == [2, 7] and tu.get(back, "temperature") == 0.7


def test_empty_tensordict_round_trips():
    td = TensorDict({"x": torch.zeros(0, 4), "ids": torch.zeros(0, dtype=torch.int64)}, batch_size=[0])
    back = deserialize_tensordict(serialize_tensordict(td))
    assert tuple(back.batch_size) == (0,) and back["x"].shape == (0, 4) and back["ids"].dtype == torch.int64
    nothing = deserialize_tensordict(serialize_tensordict(TensorDict({}, batch_size=[])))
    assert len(nothing.keys()) == 0 and tuple(nothing.batch_size) == ()


def test_pickling_a_tensordict_built_by_get_tensordict_keeps_everything():
    td = full_tensordict()
    assert_same_tensordict(td, pickle.loads(pickle.dumps(td)))


# ---------------------------------------------------------------------------------------------- DataProtos
def full_proto(n: int = 4) -> DataProto:
    tensors = {f"t_{str(d).removeprefix('torch.')}": sample(d, (n, 3)) for d in DTYPES}
    tensors["scalar_per_row"] = torch.arange(n, dtype=torch.float64)
    non_tensors = {"obj": object_column()[:n], "uid": np.array([f"u{i % 2}" for i in range(n)], dtype=object)}
    return DataProto.from_dict(tensors, non_tensors, meta_info={"temperature": 0.5, "metrics": {"a": [1.0]}})


def test_dataproto_pickle_round_trip_is_bit_exact_for_every_dtype_and_object_column():
    data = full_proto()
    back = pickle.loads(pickle.dumps(data))
    assert_same_proto(data, back)
    assert back.meta_info == {"temperature": 0.5, "metrics": {"a": [1.0]}}


def test_dataproto_chunks_of_views_round_trip_without_their_parent_storage():
    data = full_proto(4)
    part = data.chunk(2)[1]
    payload = pickle.dumps(part)
    assert len(payload) < len(pickle.dumps(data))
    assert_same_proto(part, pickle.loads(payload))


@pytest.mark.parametrize("which", ["empty_batch", "no_tensors", "nothing"])
def test_empty_dataprotos_round_trip(which, tmp_path):
    if which == "empty_batch":
        data = DataProto.from_dict({"x": torch.zeros(0, 3), "ids": torch.zeros(0, 2, dtype=torch.int64)},
                                   {"obj": np.empty(0, dtype=object)}, meta_info={"k": 1})
    elif which == "no_tensors":
        data = DataProto(non_tensor_batch={"obj": object_column()})
    else:
        data = DataProto()
    back = pickle.loads(pickle.dumps(data))
    assert_same_proto(data, back)
    data.save_to_disk(tmp_path / "d.pkl")
    assert_same_proto(data, DataProto.load_from_disk(tmp_path / "d.pkl"))


def test_dataproto_to_and_from_tensordict_round_trip():
    data = full_proto()
    td = data.to_tensordict()
    assert isinstance(td.get("obj"), NonTensorStack) and isinstance(td.get("temperature"), NonTensorData)
    back = DataProto.from_tensordict(td)
    assert_same_proto(data, back)
    assert back.meta_info["temperature"] == 0.5 and back.meta_info["metrics"] == {"a": [1.0]}
    # and through the picklable tuple form of the TensorDict (float8 included, which a plain pickle of a
    # TensorDict cannot write)
    wire = pickle.loads(pickle.dumps(serialize_tensordict(td)))
    assert_same_proto(data, DataProto.from_tensordict(deserialize_tensordict(wire)))


def test_from_tensordict_keeps_rows_of_equal_length_lists_as_one_object_per_row():
    td = tu.get_tensordict({"x": torch.arange(2), "pair": [[1, 2], [3, 4]]})
    data = DataProto.from_tensordict(td)
    assert data.non_tensor_batch["pair"].shape == (2,) and data.non_tensor_batch["pair"][1] == [3, 4]
