"""DAPO recipe, pure logic (no workers): dynamic sampling's group filter and accumulation over generation rounds,
the overlong reward shaping against a float64 hand computation, and the config rules checked before Ray starts."""

import os
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir

from recipe.dapo.dynamic_sampling import DynamicSampler, DynamicSamplingError, informative_groups, sequence_metric
from recipe.dapo.main_dapo import CONFIG_DIR, check_dapo_config
from verl.protocol import DataProto
from verl.utils.config import ConfigError
from verl.workers.reward_manager.dapo import DAPORewardManager, overlong_penalty

N, R = 4, 6  # responses per prompt, response tokens


def scored_round(tag: str, accs: list[list[float]]) -> DataProto:
    """One generation round as the trainer scores it: per prompt ``uid`` a group of N responses whose correctness
    is ``accs[prompt]``; the rule score sits on the last response token, as the reward managers write it."""
    rows = [(f"{tag}{p}", a) for p, group in enumerate(accs) for a in group]
    scores = torch.zeros(len(rows), R)
    scores[:, -1] = torch.tensor([a for _, a in rows])
    return DataProto.from_dict(
        tensors={"token_level_scores": scores, "responses": torch.arange(len(rows) * R).view(len(rows), R)},
        non_tensors={"uid": np.array([u for u, _ in rows], dtype=object),
                     "acc": np.array([a for _, a in rows], dtype=np.float64)})


ALL_RIGHT, ALL_WRONG = [1.0] * N, [0.0] * N


def test_all_correct_and_all_wrong_groups_are_dropped_and_the_batch_is_still_full():
    sampler = DynamicSampler(train_batch_size=3, n=N, metric="acc", max_num_gen_batches=5)
    # round 1: two all-correct groups, one all-wrong, one informative -> 1 of 3 groups kept
    assert not sampler.add(scored_round("a", [ALL_RIGHT, [1, 0, 0, 1], ALL_WRONG, ALL_RIGHT]))
    assert (sampler.num_gen_batches, sampler.kept_groups, sampler.dropped_groups) == (1, 1, 3)
    # round 2: one all-correct group, three informative -> 4 kept in total, one more than needed
    assert sampler.add(scored_round("b", [[0, 0, 0, 1], ALL_RIGHT, [1, 1, 1, 0], [0, 1, 0, 1]]))
    batch = sampler.batch()
    assert len(batch) == 3 * N  # full: train_batch_size groups of n responses
    uids = list(batch.non_tensor_batch["uid"])
    assert uids == ["a1"] * N + ["b0"] * N + ["b2"] * N  # whole groups, in order; the surplus group b3 is cut
    acc = batch.non_tensor_batch["acc"].astype(np.float64).reshape(3, N)
    assert (acc.std(axis=1) > 0).all()  # no all-equal group left
    # the kept rows carry their own tensors (rows 4..7 of round a, 0..3 and 8..11 of round b)
    assert torch.equal(batch.batch["responses"][:N], torch.arange(N * R, 2 * N * R).view(N, R))
    # every generated response counts in the success rate: (4 + 2 + 0 + 4) + (1 + 4 + 3 + 2) of 32
    assert sampler.metrics() == {"train/num_gen_batches": 2, "train/kept_groups": 4, "train/dropped_groups": 4,
                                 "train/gen_score/mean": pytest.approx(20 / 32)}


def test_one_round_is_enough_when_it_has_enough_informative_groups():
    sampler = DynamicSampler(train_batch_size=2, n=N, metric="seq_reward")
    assert sampler.add(scored_round("a", [[1, 0, 1, 1], ALL_WRONG, [0, 0, 1, 0]]))
    assert sampler.metrics()["train/num_gen_batches"] == 1
    assert list(dict.fromkeys(sampler.batch().non_tensor_batch["uid"])) == ["a0", "a2"]


def test_too_many_rounds_stop_with_an_error_naming_the_key():
    sampler = DynamicSampler(train_batch_size=2, n=N, metric="acc", max_num_gen_batches=2)
    assert not sampler.add(scored_round("a", [ALL_RIGHT, ALL_WRONG]))
    with pytest.raises(DynamicSamplingError, match=r"max_num_gen_batches=2.*\(<= 0: no limit\)"):
        sampler.add(scored_round("b", [ALL_RIGHT, [1, 0, 0, 0]]))
    # <= 0: no limit
    unlimited = DynamicSampler(train_batch_size=1, n=N, metric="acc", max_num_gen_batches=0)
    for i in range(6):
        assert not unlimited.add(scored_round(f"r{i}", [ALL_WRONG]))
    assert unlimited.add(scored_round("last", [[0, 1, 0, 0]])) and unlimited.num_gen_batches == 7
    with pytest.raises(RuntimeError, match="only 0 of 1"):
        DynamicSampler(train_batch_size=1, n=N, metric="acc").batch()


def test_metrics_seq_reward_sees_the_overlong_penalty_score_does_not():
    batch = scored_round("a", [ALL_RIGHT])
    batch.batch["token_level_scores"][0, -1] -= 0.25  # one correct response was penalised for its length
    assert informative_groups(batch.non_tensor_batch["uid"], sequence_metric(batch, "acc")) == ([], ["a0"])
    assert informative_groups(batch.non_tensor_batch["uid"], sequence_metric(batch, "seq_reward")) == (["a0"], [])
    np.testing.assert_array_equal(sequence_metric(batch, "seq_final_reward"), [0.75, 1, 1, 1])
    # "score" falls back to the summed token scores when the reward function reports none
    np.testing.assert_array_equal(sequence_metric(batch, "score"), sequence_metric(batch, "seq_reward"))
    batch.non_tensor_batch.pop("acc")
    with pytest.raises(ValueError, match="reported no per-sample 'acc'.*reward_manager=dapo"):
        sequence_metric(batch, "acc")
    # a group of one response is kept (nothing to compare), as in verl
    assert informative_groups(np.array(["x", "y", "y"]), np.array([1.0, 0.0, 0.0])) == (["x"], ["y"])


def test_overlong_penalty_float64_hand_computation():
    max_len, buf, factor = 20, 8, 1.5
    for length in range(0, max_len + 1):
        expected = np.float64(0.0)
        if length > max_len - buf:  # inside the buffer: linear from 0 at max_len - buf to -factor at max_len
            expected = -np.float64(length - (max_len - buf)) / np.float64(buf) * np.float64(factor)
        assert overlong_penalty(length, max_len, buf, factor) == pytest.approx(float(expected), abs=1e-15), length
    assert overlong_penalty(12, 20, 8, 1.5) == 0.0 and overlong_penalty(20, 20, 8, 1.5) == pytest.approx(-1.5)
    assert overlong_penalty(16, 20, 8, 1.5) == pytest.approx(-0.75, abs=1e-15)

    # the reward manager adds it to the rule score (and logs it) for every sample
    mgr = DAPORewardManager(None, 0, max_resp_len=max_len,
                            overlong_buffer_cfg={"enable": True, "len": buf, "penalty_factor": factor, "log": True})
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, max_len + 1, size=32)
    rule = rng.integers(0, 2, size=32).astype(np.float64)
    shaped, extra = mgr.postprocess([SimpleNamespace(valid_response_length=int(n)) for n in lengths],
                                    list(rule), {})
    ref = rule + np.minimum(-(lengths - (max_len - buf)) / buf * factor, 0.0)
    np.testing.assert_allclose(np.asarray(shaped, dtype=np.float64), ref, rtol=0, atol=1e-12)
    assert extra["overlong"] == [bool(n > max_len - buf) for n in lengths]


def _config(*overrides):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        return compose(config_name="dapo_trainer", overrides=["data.train_batch_size=8",
                                                              "actor_rollout_ref.rollout.n=4", *overrides])


def test_dapo_yaml_defaults_are_verls():
    cfg = _config()
    assert cfg.data.gen_batch_size == 8 and cfg.reward_model.reward_manager == "dapo"
    assert dict(cfg.algorithm.filter_groups) == {"enable": False, "metric": None, "max_num_gen_batches": 0}
    assert dict(cfg.reward_model.overlong_buffer) == {"enable": False, "len": 0, "penalty_factor": 0.0, "log": False}
    check_dapo_config(cfg)  # the defaults pass
    check_dapo_config(_config("algorithm.filter_groups.enable=true", "algorithm.filter_groups.metric=acc",
                              "data.gen_batch_size=24", "reward_model.overlong_buffer.enable=true",
                              "reward_model.overlong_buffer.len=4", "reward_model.overlong_buffer.penalty_factor=1.0",
                              "data.max_response_length=16"))


@pytest.mark.parametrize("overrides, message", [
    (["algorithm.filter_groups.enable=true", "algorithm.filter_groups.metric=accuracy"],
     "algorithm.filter_groups.metric='accuracy' is not one of: acc, score, seq_reward, seq_final_reward"),
    (["algorithm.filter_groups.enable=true"], "algorithm.filter_groups.enable=True needs algorithm.filter_groups.metric"),
    (["algorithm.filter_groups.enable=true", "algorithm.filter_groups.metric=acc", "actor_rollout_ref.rollout.n=1"],
     "actor_rollout_ref.rollout.n=1"),
    (["algorithm.filter_groups.enable=true", "algorithm.filter_groups.metric=seq_final_reward",
      "algorithm.use_kl_in_reward=true"], "use metric=seq_reward"),
    (["reward_model.overlong_buffer.len=-4"], "reward_model.overlong_buffer.len=-4 must be an integer >= 0"),
    (["reward_model.overlong_buffer.penalty_factor=-1"], "reward_model.overlong_buffer.penalty_factor=-1"),
    (["reward_model.overlong_buffer.enable=true", "reward_model.overlong_buffer.len=0"],
     "needs 0 < reward_model.overlong_buffer.len <= data.max_response_length"),
    (["reward_model.overlong_buffer.enable=true", "reward_model.overlong_buffer.len=4",
      "reward_model.reward_manager=naive"], "set reward_model.reward_manager=dapo"),
    (["+reward_model.overlong_buffer.lenght=4"], "did you mean 'reward_model.overlong_buffer.len'"),
    (["data.gen_batch_size=4"], "data.gen_batch_size=4 is smaller than data.train_batch_size=8"),
    (["data.gen_batch_size=16"], "algorithm.filter_groups.enable=False"),
])
def test_bad_dapo_config_is_a_config_error_naming_the_key(overrides, message):
    with pytest.raises(ConfigError) as err:
        check_dapo_config(_config(*overrides))
    assert message in str(err.value)
