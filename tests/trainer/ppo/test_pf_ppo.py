"""PF-PPO (verl.trainer.ppo.pf_ppo): weights against hand computations, seeded resampling, row alignment."""

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from verl.protocol import DataProto
from verl.trainer.config_schema.ppo import AlgorithmConfig, PFPPOConfig
from verl.trainer.ppo import core_algos
from verl.trainer.ppo import pf_ppo as pf

SCORES = torch.tensor([-2.0, 0.0, 1.0, 3.0])


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


def make_data(seq_scores, L=3):
    """Row i: every field encodes i; the sequence score is spread over the first token."""
    B = len(seq_scores)
    token_scores = torch.zeros(B, L)
    token_scores[:, 0] = torch.as_tensor(seq_scores, dtype=torch.float32)
    rows = torch.arange(B)
    tensors = {
        "token_level_scores": token_scores,
        "row": rows.clone(),
        "responses": rows[:, None] * 10 + torch.arange(L)[None, :],
        "advantages": rows[:, None].float().expand(B, L).clone() / 7,
    }
    non_tensors = {"uid": np.array([f"u{i}" for i in range(B)], dtype=object),
                   "data_source": np.array([f"src{i}" for i in range(B)], dtype=object)}
    meta = {"global_token_num": [100 + i for i in range(B)], "temperature": 0.7, "short_list": [1, 2]}
    return DataProto.from_dict(tensors=tensors, non_tensors=non_tensors, meta_info=meta)


def test_weights_match_hand_computation():
    assert pf.pf_ppo_weights(SCORES, "pow", 2.0).tolist() == [4.0, 0.0, 1.0, 9.0]
    assert pf.pf_ppo_weights(SCORES, "pow", 1.0).tolist() == [2.0, 0.0, 1.0, 3.0]
    assert pf.pf_ppo_weights(SCORES, "pow", 0.0).tolist() == [1.0, 1.0, 1.0, 1.0]  # 0**0 == 1: uniform
    assert pf.pf_ppo_weights(SCORES, "max_min").tolist() == [1.0, 0.0, 0.0, 1.0]
    assert pf.pf_ppo_weights(SCORES, "max_random").tolist() == [0.1, 0.1, 0.1, 0.4]
    # ties: every row at the max (or min) counts
    assert pf.pf_ppo_weights(torch.tensor([1.0, 3.0, 3.0, 1.0, 2.0]), "max_min").tolist() == [1, 1, 1, 1, 0]


def test_indices_are_multinomial_over_weights_plus_eps():
    for method, pow_, expected in [("pow", 2.0, [4.0, 0.0, 1.0, 9.0]), ("max_random", 2.0, [0.1, 0.1, 0.1, 0.4])]:
        got = pf.pf_ppo_sample_indices(SCORES, method, pow_, generator=gen(3))
        ref = torch.multinomial(torch.tensor(expected, dtype=torch.float64) + 1e-8, 4, replacement=True,
                                generator=gen(3))
        assert got.tolist() == ref.tolist()


def test_seeded_generator_is_reproducible():
    data = make_data(torch.linspace(-1, 1, 16))
    a = pf.compute_pf_ppo_reweight_data(data, "pow", 2.0, generator=gen(5))
    b = pf.compute_pf_ppo_reweight_data(data, "pow", 2.0, generator=gen(5))
    c = pf.compute_pf_ppo_reweight_data(data, "pow", 2.0, generator=gen(6))
    assert a.batch["row"].tolist() == b.batch["row"].tolist()
    assert a.batch["row"].tolist() != c.batch["row"].tolist()


def test_max_min_keeps_only_extreme_rows():
    scores = [0.3, -1.0, 0.5, 2.0, 0.1, 1.5, -0.5, 0.0]  # min at row 1, max at row 3
    data = make_data(scores)
    for seed in range(5):
        out = pf.compute_pf_ppo_reweight_data(data, "max_min", generator=gen(seed))
        assert len(out) == len(data)
        assert set(out.batch["row"].tolist()) <= {1, 3}
        assert set(out.batch["token_level_scores"].sum(-1).tolist()) <= {-1.0, 2.0}


def test_pow_zero_is_uniform():
    n = 64
    data = make_data(torch.linspace(-3, 5, n))
    out = pf.compute_pf_ppo_reweight_data(data, "pow", weight_pow=0.0, generator=gen(11))
    uniform = torch.multinomial(torch.ones(n, dtype=torch.float64), n, replacement=True, generator=gen(11))
    assert out.batch["row"].tolist() == uniform.tolist()


def test_max_random_favours_the_best_row_by_four_to_one():
    # 4 rows, max weight 0.4 vs 0.1: P(best) = 0.4 / 0.7 = 4/7 for every draw
    g = gen(0)
    draws = torch.cat([pf.pf_ppo_sample_indices(SCORES, "max_random", generator=g) for _ in range(2000)])
    assert (draws == 3).float().mean().item() == pytest.approx(4 / 7, abs=0.02)
    for other in (0, 1, 2):
        assert (draws == other).float().mean().item() == pytest.approx(1 / 7, abs=0.02)


def test_all_zero_scores_resample_uniformly_instead_of_failing():
    out = pf.compute_pf_ppo_reweight_data(make_data([0.0] * 6), "pow", 2.0, generator=gen(2))
    ref = torch.multinomial(torch.full((6,), 1e-8, dtype=torch.float64), 6, replacement=True, generator=gen(2))
    assert out.batch["row"].tolist() == ref.tolist()


def test_every_field_stays_row_aligned():
    data = make_data([0.5, -2.0, 1.0, 3.0, -0.25, 2.5])
    out = pf.compute_pf_ppo_reweight_data(data, "pow", 1.0, generator=gen(1))
    rows = out.batch["row"].tolist()
    assert sorted(set(rows)) != list(range(6)), "with replacement and unequal weights some rows repeat"
    for j, i in enumerate(rows):
        assert torch.equal(out.batch["token_level_scores"][j], data.batch["token_level_scores"][i])
        assert torch.equal(out.batch["responses"][j], data.batch["responses"][i])
        assert torch.equal(out.batch["advantages"][j], data.batch["advantages"][i])
        assert out.non_tensor_batch["uid"][j] == f"u{i}"
        assert out.non_tensor_batch["data_source"][j] == f"src{i}"
        assert out.meta_info["global_token_num"][j] == 100 + i  # per-row meta_info lists follow the rows
    assert out.meta_info["temperature"] == 0.7 and out.meta_info["short_list"] == [1, 2]
    assert data.batch["row"].tolist() == list(range(6))  # the input is not modified


def test_bad_reweight_method_names_key_and_choices():
    with pytest.raises(ValueError, match=r"algorithm\.pf_ppo\.reweight_method='nope'.*pow, max_min, max_random"):
        pf.compute_pf_ppo_reweight_data(make_data([1.0, 2.0]), "nope")


def test_negative_pow_on_zero_score_explains_weight_pow():
    with pytest.raises(ValueError, match=r"algorithm\.pf_ppo\.weight_pow=-1"):
        pf.pf_ppo_sample_indices(SCORES, "pow", -1.0)


def test_core_algos_reexports_and_compute_advantage_resamples_only_gae():
    assert core_algos.compute_pf_ppo_reweight_data is pf.compute_pf_ppo_reweight_data
    scores = [0.3, -1.0, 0.5, 2.0]
    cfg = AlgorithmConfig(use_pf_ppo=True, pf_ppo=PFPPOConfig(reweight_method="max_min", weight_pow=2.0))

    def data():
        d = make_data(scores)
        d.batch["token_level_rewards"] = d.batch["token_level_scores"].clone()
        d.batch["response_mask"] = torch.ones(4, 3)
        d.batch["values"] = torch.zeros(4, 3)
        d.non_tensor_batch["uid"] = np.array(["a", "a", "b", "b"], dtype=object)
        return d

    torch.manual_seed(0)
    gae = core_algos.compute_advantage(data(), "gae", config=cfg)
    assert set(gae.batch["row"].tolist()) <= {1, 3}
    # the resampled advantages are the rows' own GAE advantages (computed before resampling)
    plain = core_algos.compute_advantage(data(), "gae")
    assert torch.equal(gae.batch["advantages"], plain.batch["advantages"][gae.batch["row"]])
    grpo = core_algos.compute_advantage(data(), "grpo", config=cfg)
    assert grpo.batch["row"].tolist() == [0, 1, 2, 3]  # as in verl, PF-PPO applies to GAE only


def test_config_schema_checks_pf_ppo_keys(capsys):
    from verl.trainer.config_schema import _check_pf_ppo
    from verl.utils.config import ConfigError

    def cfg(**pf_ppo):
        base = {"use_pf_ppo": True, "adv_estimator": "gae", "pf_ppo": {"reweight_method": "pow", "weight_pow": 2.0}}
        base["pf_ppo"].update(pf_ppo)
        return OmegaConf.create({"algorithm": base})

    _check_pf_ppo(cfg())
    _check_pf_ppo(cfg(reweight_method="max_random", weight_pow=0))
    with pytest.raises(ConfigError, match=r"algorithm\.pf_ppo\.reweight_method='maxmin' is not one of: pow, max_min"):
        _check_pf_ppo(cfg(reweight_method="maxmin"))
    for bad in (-1.0, "two", True):
        with pytest.raises(ConfigError, match=r"algorithm\.pf_ppo\.weight_pow=.* must be a number >= 0"):
            _check_pf_ppo(cfg(weight_pow=bad))
    grpo = cfg()
    grpo.algorithm.adv_estimator = "grpo"
    _check_pf_ppo(grpo)
    assert "use_pf_ppo=True acts only with algorithm.adv_estimator=gae" in capsys.readouterr().out
