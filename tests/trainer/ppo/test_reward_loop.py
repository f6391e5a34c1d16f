"""``reward_model.num_workers``: the reward function scores slices of a batch in that many Ray actors; the scores and
extra infos come back in row order, equal to one call on the whole batch."""

import sys

import pytest
import ray
import torch

from verl import DataProto
from verl.trainer.ppo.reward import RewardLoop, compute_reward

pytestmark = [pytest.mark.e2e, pytest.mark.own_ray]  # Ray actors, in a Ray this module starts and shuts down


def score_rows(data, return_dict=False):
    """A reward function whose every row's score and extra info depend on that row only."""
    x = data.batch["x"]
    tensor = torch.zeros(len(x), 3)
    tensor[:, -1] = x.float() * 0.5 + 1
    extra = {"row": [int(v) for v in x], "pid_free": ["r%d" % int(v) for v in x]}
    return {"reward_tensor": tensor, "reward_extra_info": extra} if return_dict else tensor


@pytest.fixture(scope="module")
def cluster():
    from verl.utils.ray_utils import init_local_ray

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the actors need not import this file
    init_local_ray(num_cpus=2)
    yield
    ray.shutdown()  # nothing of it stays in the test process (later tests spawn their own processes)


def test_reward_loop_scores_like_one_call_in_row_order(cluster):
    loop = RewardLoop(score_rows, 3)  # three actors, started once
    for rows in (7, 9, 2):  # uneven slices, and fewer rows than workers
        data = DataProto.from_dict({"x": torch.arange(rows) * 3 + 1})
        expected, expected_extra = compute_reward(data, score_rows)
        got, extra = compute_reward(data, loop)
        assert torch.equal(got, expected), rows
        assert extra == expected_extra, rows
    assert torch.equal(loop(data), expected)  # the plain-tensor form of a reward function too


def test_reward_loop_refuses_zero_workers():
    with pytest.raises(ValueError, match="reward_model.num_workers=0 must be >= 1"):
        RewardLoop(score_rows, 0)
