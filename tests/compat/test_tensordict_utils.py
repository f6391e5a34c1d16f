"""verl.utils.tensordict_utils: building, reading, indexing, concatenating, padding and iterating TensorDict
batches that hold tensors, jagged tensors, per-row objects and batch-level values."""

from __future__ import annotations

import pytest
import torch
from tensordict import NonTensorData, NonTensorStack, TensorDict

from verl.utils import tensordict_utils as tu


def jagged(*lengths, start=0):
    return torch.nested.as_nested_tensor([torch.arange(n) + start for n in lengths], layout=torch.jagged)


def make(n=4):
    return tu.get_tensordict({"x": torch.arange(n * 2).reshape(n, 2), "ragged": jagged(*range(1, n + 1)),
                              "labels": [f"l{i}" for i in range(n)]}, non_tensor_dict={"temperature": 0.3})


def test_get_tensordict_and_plain_getters():
    td = make()
    assert tuple(td.batch_size) == (4,)
    assert isinstance(td.get("labels"), NonTensorStack) and isinstance(td.get("temperature"), NonTensorData)
    assert tu.get(td, "labels") == ["l0", "l1", "l2", "l3"] and tu.get(td, "temperature") == 0.3
    assert tu.get(td, "missing", default="d") == "d" and tu.get_non_tensor_data(td, "temperature", None) == 0.3
    assert tu.unwrap_non_tensor_data(NonTensorData(5)) == 5 and tu.unwrap_non_tensor_data(5) == 5
    meta_only = tu.get_tensordict({}, {"a": 1})
    assert tuple(meta_only.batch_size) == () and tu.get(meta_only, "a") == 1


def test_get_tensordict_rejects_bad_input_with_named_keys():
    with pytest.raises(ValueError, match="'y' is 3 but 'x' has 2"):
        tu.get_tensordict({"x": torch.zeros(2), "y": [1, 2, 3]})
    with pytest.raises(TypeError, match="list 'y' holds torch.Tensors"):
        tu.get_tensordict({"y": [torch.zeros(1)]})
    with pytest.raises(ValueError, match="in both"):
        tu.get_tensordict({"x": torch.zeros(2)}, {"x": 1})
    with pytest.raises(TypeError, match="must be a tensordict.TensorDict"):
        tu.assign_non_tensor({"x": 1}, a=1)


def test_assign_non_tensor_picks_stack_or_data():
    td = TensorDict({"x": torch.zeros(3)}, batch_size=[3])
    out = tu.assign_non_tensor(td, scores=[[], [0.5, 0.8], [0.9]], tag="run-1")
    assert out is td and tu.get(td, "scores") == [[], [0.5, 0.8], [0.9]] and tu.get(td, "tag") == "run-1"


def test_pop_and_key_selection():
    td = make()
    sub = tu.get_keys(td, ["x", "labels", "temperature"])
    assert set(sub.keys()) == {"x", "labels", "temperature"} and "x" in td.keys()
    popped = tu.pop_keys(td, ["labels", "temperature"])
    assert tu.get(popped, "labels") == ["l0", "l1", "l2", "l3"] and "labels" not in td.keys()
    assert torch.equal(tu.pop(td, "x"), torch.arange(8).reshape(4, 2)) and tu.pop(td, "x", "gone") == "gone"
    with pytest.raises(KeyError, match="nope"):
        tu.get_keys(td, ["nope"])


def test_index_select_keeps_jagged_rows_objects_and_batch_level_values():
    td = make()
    sel = tu.index_select_tensor_dict(td, [3, 1])
    assert tuple(sel.batch_size) == (2,) and sel["x"].tolist() == [[6, 7], [2, 3]]
    assert [r.tolist() for r in sel["ragged"].unbind()] == [[0, 1, 2, 3], [0, 1]]
    assert tu.get(sel, "labels") == ["l3", "l1"] and tu.get(sel, "temperature") == 0.3
    assert tu.index_select_tensor_dict(None, [0]) is None


def test_concat_with_nested_tensors_and_assert_eq():
    a = tu.get_tensordict({"x": torch.zeros(2, 1), "r": jagged(1, 2)})
    b = tu.get_tensordict({"x": torch.ones(1, 1), "r": jagged(3, start=5)})
    c = tu.concat_tensordict([a, b])
    assert c["x"].flatten().tolist() == [0, 0, 1] and [r.tolist() for r in c["r"].unbind()] == [[0], [0, 1], [5, 6, 7]]
    tu.assert_tensordict_eq(c, tu.concat_tensordict([a, b]))
    with pytest.raises(AssertionError, match="row 2 differs"):
        tu.assert_tensordict_eq(c, tu.concat_tensordict([a, tu.get_tensordict({"x": torch.ones(1, 1),
                                                                                "r": jagged(3)})]))
    plain = tu.concat_tensordict([TensorDict({"x": torch.zeros(1)}, [1]), TensorDict({"x": torch.ones(2)}, [2])])
    assert plain["x"].tolist() == [0, 1, 1]


def test_union_pad_unpad_and_iterate():
    td = TensorDict({"x": torch.arange(5)}, batch_size=[5])
    other = TensorDict({"x": torch.arange(5), "y": torch.ones(5)}, batch_size=[5])
    assert set(tu.union_tensor_dict(td, other).keys()) == {"x", "y"}
    with pytest.raises(ValueError, match="different values"):
        tu.union_tensor_dict(td, TensorDict({"x": torch.zeros(5)}, batch_size=[5]))
    padded, pad = tu.pad_to_divisor(TensorDict({"x": torch.arange(3)}, batch_size=[3]), 8)
    assert pad == 5 and padded["x"].tolist() == [0, 1, 2, 0, 1, 2, 0, 1]
    assert tu.unpad(padded, pad)["x"].tolist() == [0, 1, 2]
    batches = list(tu.make_iterator(TensorDict({"x": torch.arange(6)}, batch_size=[6]), 2, epochs=2))
    assert [b["x"].tolist() for b in batches] == [[0, 1], [2, 3], [4, 5]] * 2
    with pytest.raises(ValueError, match="not divisible"):
        tu.make_iterator(td, 2, 1)
