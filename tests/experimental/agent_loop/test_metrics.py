"""Agent-loop step metrics against hand computations; a batch rollout (no agent fields) gives none."""

import numpy as np
import pytest
import torch

from verl.experimental.agent_loop.metrics import agent_loop_metrics
from verl.protocol import DataProto


def obj(values):
    arr = np.empty(len(values), dtype=object)
    for i, v in enumerate(values):
        arr[i] = v
    return arr


def test_metrics_by_hand():
    data = DataProto.from_dict({"x": torch.zeros(4, 1)}, non_tensors={
        "__num_turns__": np.array([2, 4, 6, 4]), "__tool_calls__": obj([0, 1, 3, 2]),
        "__tool_errors__": obj([0, 1, 1, 0]), "__unknown_agent__": obj([0, 0, 1, 0]),
        "__generate_s__": obj([0.5, 1.0, 1.5, 1.0]), "__tool_s__": obj([0.0, 0.2, 0.4, 0.2])})
    m = agent_loop_metrics(data)
    assert (m["num_turns/min"], m["num_turns/max"], m["num_turns/mean"]) == (2.0, 6.0, 4.0)
    assert m["agent_loop/tool_calls/mean"] == 1.5 and m["agent_loop/tool_calls/max"] == 3.0
    assert m["agent_loop/tool_errors/sum"] == 2.0 and m["agent_loop/tool_errors/mean"] == 0.5
    assert m["agent_loop/tool_error_rate"] == pytest.approx(2 / 6)
    assert m["agent_loop/unknown_agent_name"] == 1.0
    assert m["timing_s/agent_loop/tool_calls/max"] == 0.4 and m["timing_s/agent_loop/generate_sequences/mean"] == 1.0
    assert agent_loop_metrics(DataProto.from_dict({"x": torch.zeros(2, 1)})) == {}
