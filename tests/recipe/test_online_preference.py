"""Online preference recipes, pure parts: best-vs-worst pairing, win-probability estimation and the SPPO loss
against float64 hand computations, and config errors that name their key (raised before any worker starts)."""

import math
import re

import pytest
import torch
from omegaconf import OmegaConf

from verl.trainer.preference.losses import sppo_loss
from verl.trainer.preference.online import (OnlinePreferenceDriver, SPPOLoss, all_pairs, best_worst_pairs,
                                            check_sampling, make_pairs, win_probabilities)
from verl.utils.config import ConfigError


@pytest.mark.parametrize("scores, n, want", [
    ([0.0, 1.0, 0.5, 0.0], 4, [(1, 0)]),                       # first of the tied worst
    ([1.0, 1.0, 0.0, 0.0, 0.3, 0.3, 0.3, 0.3], 4, [(0, 2)]),   # second prompt all tied: no pair
    ([0.2, 0.9, 0.5, 1.0, 0.7, 0.1], 3, [(1, 0), (3, 5)]),
    ([0.0, 0.0, 0.0, 0.0], 2, []),
    ([-1.0, 2.0], 2, [(1, 0)]),
])
def test_best_worst_pairs(scores, n, want):
    assert best_worst_pairs(torch.tensor(scores), n) == want


@pytest.mark.parametrize("scores, n, want", [
    ([0.0, 1.0, 0.5, 0.0], 4, [(1, 0), (1, 2), (1, 3), (2, 0), (2, 3)]),   # the tied zeros are not paired
    ([1.0, 1.0, 0.0, 0.0, 0.3, 0.3, 0.3, 0.3], 4, [(0, 2), (0, 3), (1, 2), (1, 3)]),
    ([0.0, 0.0], 2, []),
    ([-1.0, 2.0, 0.0, 0.0], 2, [(1, 0)]),
])
def test_all_pairs(scores, n, want):
    assert all_pairs(torch.tensor(scores), n) == want


def test_all_pairs_of_binary_scores_count_right_times_wrong():
    scores = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 0.0, 0.0] + [0.0] * 8 + [1.0] * 7 + [0.0])
    pairs = all_pairs(scores, 8)
    assert len(pairs) == 3 * 5 + 0 + 7 * 1
    assert all(scores[c] == 1.0 and scores[r] == 0.0 and c // 8 == r // 8 for c, r in pairs)
    assert len(set(pairs)) == len(pairs)
    assert make_pairs(scores, 8, "all") == pairs and make_pairs(scores, 8, "best_worst") == best_worst_pairs(scores, 8)
    with pytest.raises(ValueError, match="'random' is not one of: best_worst, all"):
        make_pairs(scores, 8, "random")


def test_pairing_needs_whole_groups_of_two_or_more():
    with pytest.raises(ValueError, match="groups of n=4"):
        best_worst_pairs(torch.zeros(6), 4)
    with pytest.raises(ValueError, match="at least 2"):
        best_worst_pairs(torch.zeros(3), 1)


def test_indicator_win_probabilities_by_hand():
    scores = torch.tensor([1.0, 0.0, 0.0, 0.5, 2.0, 2.0], dtype=torch.float64)
    p = win_probabilities(scores, 3, "indicator")
    # prompt 1: y0 beats both (1); y1, y2 lose to y0 and tie each other: (0 + 0.5) / 2
    # prompt 2: y3 loses to both (0); y4, y5 beat y3 and tie: (1 + 0.5) / 2
    want = [1.0, 0.25, 0.25, 0.0, 0.75, 0.75]
    assert p.dtype == torch.float64 and p.tolist() == want
    assert p.reshape(2, 3).mean(1).tolist() == [0.5, 0.5]  # P(i > j) + P(j > i) = 1 within a prompt


def test_bradley_terry_win_probabilities_by_hand():
    s = [0.3, -1.2, 2.0, 0.0]
    p = win_probabilities(torch.tensor(s, dtype=torch.float64), 4, "bradley_terry")
    for i in range(4):
        want = sum(1.0 / (1.0 + math.exp(-(s[i] - s[j]))) for j in range(4) if j != i) / 3
        assert p[i].item() == pytest.approx(want, rel=1e-12)
    assert p.mean().item() == pytest.approx(0.5, rel=1e-12)
    with pytest.raises(ValueError, match="'elo' is not one of: indicator, bradley_terry"):
        win_probabilities(torch.zeros(4), 2, "elo")


def test_sppo_loss_by_hand():
    pol = torch.tensor([-3.0, -5.5, -2.25], dtype=torch.float64)
    ref = torch.tensor([-3.5, -5.0, -2.25], dtype=torch.float64)
    win = torch.tensor([1.0, 0.25, 0.5], dtype=torch.float64)
    loss, ratio = sppo_loss(pol, ref, win, eta=2.0)
    want = [(0.5 - 2.0 * 0.5) ** 2, (-0.5 - 2.0 * -0.25) ** 2, (0.0 - 0.0) ** 2]
    assert loss.tolist() == pytest.approx(want, rel=1e-12) and ratio.tolist() == [0.5, -0.5, 0.0]


def test_sppo_engine_loss_is_the_mean_over_responses_with_gradient():
    g = torch.Generator().manual_seed(0)
    log_probs = (-torch.rand(4, 3, generator=g, dtype=torch.float64)).requires_grad_(True)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 1]], dtype=torch.float64)
    ref = torch.tensor([-1.0, -1.5, -0.2, -0.9], dtype=torch.float64)
    win = torch.tensor([0.9, 0.1, 0.5, 0.6], dtype=torch.float64)
    loss, metrics = SPPOLoss(eta=3.0)({"log_probs": log_probs}, {"response_mask": mask, "ref_logps": ref,
                                                                  "win_prob": win})
    seq = [sum(log_probs[i, t].item() for t in range(3) if mask[i, t]) for i in range(4)]
    terms = [(seq[i] - ref[i].item() - 3.0 * (win[i].item() - 0.5)) ** 2 for i in range(4)]
    assert loss.item() == pytest.approx(sum(terms) / 4, rel=1e-12)
    assert metrics["sppo/log_ratio/winners"].item() == pytest.approx((seq[0] - ref[0].item() + seq[3] - ref[3].item()) / 2)
    loss.backward()
    # d loss / d log_prob[i, t] = 2 (r_i - target_i) / 4 on the response tokens, 0 on padding
    d0 = 2 * (seq[0] - ref[0].item() - 3.0 * 0.4) / 4
    assert log_probs.grad[0].tolist() == pytest.approx([d0, d0, 0.0], rel=1e-12)
    with pytest.raises(ValueError, match="actor_rollout_ref.actor.sppo_eta=0.0"):
        SPPOLoss(eta=0.0)


def _config(freq=-1, n=4, do_sample=True, lora=0):
    return OmegaConf.create({"trainer": {"ref_update_freq": freq},
                             "actor_rollout_ref": {"model": {"lora_rank": lora},
                                                   "rollout": {"n": n, "do_sample": do_sample}}})


@pytest.mark.parametrize("freq", [-1, 1, 3])
def test_ref_update_freq_accepted(freq):
    assert OnlinePreferenceDriver._check_ref_update_freq(_config(freq)) == freq


@pytest.mark.parametrize("config, message", [
    (_config(freq=0), "trainer.ref_update_freq=0"),
    (_config(freq="often"), "trainer.ref_update_freq='often'"),
    (_config(freq=1.5), "trainer.ref_update_freq=1.5"),
    (_config(freq=2, lora=8), "trainer.ref_update_freq=2 with actor_rollout_ref.model.lora_rank=8"),
])
def test_ref_update_freq_errors_name_the_key(config, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        OnlinePreferenceDriver._check_ref_update_freq(config)


def test_sampling_errors_name_the_key():
    assert check_sampling(_config(n=4), min_n=2) == 4
    with pytest.raises(ConfigError, match=re.escape("actor_rollout_ref.rollout.n=1")):
        check_sampling(_config(n=1), min_n=2)
    with pytest.raises(ConfigError, match=re.escape("actor_rollout_ref.rollout.do_sample=false")):
        check_sampling(_config(do_sample=False), min_n=2)


def test_online_dpo_config_errors_name_the_key():
    from recipe.online_dpo.main_online_dpo import check_config

    def cfg(**section):
        base = {"loss_type": "sigmoid", "beta": 0.1, "label_smoothing": 0.0}
        return OmegaConf.merge(_config(), {"online_dpo": {**base, **section}})

    assert check_config(cfg()).beta == 0.1
    assert check_config(cfg(pairs="all")).beta == 0.1
    for section, message in (({"loss_type": "kto"}, "loss_type='kto' is not a pairwise preference loss"),
                             ({"beta": 0.0}, "beta must be > 0"),
                             ({"label_smoothing": 0.7}, "label_smoothing must be in [0, 0.5)"),
                             ({"pairs": "random"}, "online_dpo.pairs='random': set best_worst")):
        with pytest.raises(ConfigError, match=re.escape(message)):
            check_config(cfg(**section))


def _spin_config(beta=0.1, gen_len=8, data_len=8):
    return OmegaConf.merge(_config(n=1), {"actor_rollout_ref": {"actor": {"dpo_beta": beta},
                                                                "rollout": {"response_length": gen_len}},
                                          "data": {"max_response_length": data_len}})


def test_spin_config_errors_name_the_key():
    from recipe.spin.main_spin import check_config

    assert check_config(_spin_config(beta=0.5)).beta == 0.5
    for cfg, message in ((_spin_config(beta=0), "actor_rollout_ref.actor.dpo_beta=0"),
                         (_spin_config(beta="hot"), "actor_rollout_ref.actor.dpo_beta='hot'"),
                         (_spin_config(gen_len=16), "actor_rollout_ref.rollout.response_length=16 differs from "
                                                    "data.max_response_length=8")):
        with pytest.raises(ConfigError, match=re.escape(message)):
            check_config(cfg)


def test_spin_same_response_compares_tokens_up_to_eos():
    from recipe.spin.main_spin import same_response
    from verl.protocol import DataProto

    a = DataProto.from_dict({"responses": torch.tensor([[5, 6, 2, 0], [5, 6, 2, 0], [5, 2, 0, 0]]),
                             "response_mask": torch.tensor([[1, 1, 1, 0], [1, 1, 1, 0], [1, 1, 0, 0]])})
    b = DataProto.from_dict({"responses": torch.tensor([[5, 6, 2, 9], [5, 7, 2, 0], [5, 2, 4, 0]]),
                             "response_mask": torch.tensor([[1., 1., 1., 0.], [1., 1., 1., 0.], [1., 1., 1., 0.]])})
    assert same_response(a, b).tolist() == [True, False, False]  # padding ignored; a token or a length differs


def test_response_dataset_targets_and_missing_column(tmp_path):
    from verl.trainer.preference.dataset import PreferenceDataError, ResponseDataset
    from verl.utils.embedded import make_model_dir
    from verl.utils.embedded.arithmetic import ArithmeticConfig
    from verl.utils.embedded.preferences import write_preference_files
    from verl.workers.worker_utils import load_tokenizer

    files = write_preference_files(str(tmp_path / "data"), n_train=6, n_test=2, config=ArithmeticConfig(max_digits=1))
    tok = load_tokenizer(make_model_dir(str(tmp_path / "model"), size="tiny", seed=0))
    data = {"response_key": "chosen", "max_prompt_length": 32, "max_response_length": 8}
    ds = ResponseDataset(files["train"], tok, data)
    rows = ds.targets([0, 1])
    assert rows.batch["input_ids"].shape == (2, 40) and rows.batch["responses"].shape == (2, 8)
    n_tokens = int(rows.batch["response_mask"][0].sum())
    assert rows.batch["responses"][0, n_tokens - 1].item() == tok.eos_token_id  # the target ends on eos
    assert ds.target_texts([0])[0] == ds.rows[0]["chosen"]
    from recipe.spin.main_spin import response_texts  # padding after eos (any id) is not part of the answer
    garbage = rows.batch["responses"].clone()
    garbage[rows.batch["response_mask"] == 0] = 0
    rows.batch["responses"] = garbage
    assert response_texts(tok, rows) == ds.target_texts([0, 1])
    with pytest.raises(PreferenceDataError, match=r"missing column\(s\) \['response'\]"):
        ResponseDataset(files["train"], tok, {**data, "response_key": "response"})


def test_sppo_config_errors_name_the_key():
    from recipe.sppo.main_sppo import check_config

    def cfg(eta=1.0, kind="indicator", n=4):
        return OmegaConf.merge(_config(n=n), {"sppo": {"win_rate": kind}, "actor_rollout_ref": {"actor": {"sppo_eta": eta}}})

    assert check_config(cfg(eta=2.0)).eta == 2.0
    for c, message in ((cfg(eta=-1.0), "actor_rollout_ref.actor.sppo_eta=-1.0"),
                       (cfg(eta="big"), "actor_rollout_ref.actor.sppo_eta='big'"),
                       (cfg(kind="elo"), "sppo.win_rate='elo' is not one of: indicator, bradley_terry"),
                       (cfg(n=1), "actor_rollout_ref.rollout.n=1")):
        with pytest.raises(ConfigError, match=re.escape(message)):
            check_config(c)


@pytest.mark.parametrize("module, config_name, override, message", [
    ("online_dpo", "online_dpo_trainer", "online_dpo.micro_batch_size_per_gpu=0",
     "online_dpo.micro_batch_size_per_gpu=0: set an integer >= 1"),
    ("spin", "spin_trainer", "trainer.ref_update_freq=0", "trainer.ref_update_freq=0"),
    ("sppo", "sppo_trainer", "actor_rollout_ref.actor.use_dynamic_bsz=true",
     "actor_rollout_ref.actor.use_dynamic_bsz=true"),
])
def test_command_line_config_errors_exit_2_before_workers(tmp_path, capsys, module, config_name, override, message):
    from hydra import compose, initialize_config_dir
    from pathlib import Path

    import ray

    from verl.trainer.recipe_driver import EXIT_CONFIG_ERROR, quiet_searchpath_warning, run_recipe
    from verl.utils.embedded import make_model_dir

    quiet_searchpath_warning()
    trainer_cls = {"online_dpo": "recipe.online_dpo.main_online_dpo:OnlineDPOTrainer",
                   "spin": "recipe.spin.main_spin:SPINTrainer", "sppo": "recipe.sppo.main_sppo:SPPOTrainer"}[module]
    mod, name = trainer_cls.split(":")
    cls = getattr(__import__(mod, fromlist=[name]), name)
    model = make_model_dir(str(tmp_path / "model"), size="tiny", seed=0)
    config_dir = Path(__file__).resolve().parents[2] / "recipe" / module / "config"
    with initialize_config_dir(config_dir=str(config_dir), version_base=None):
        cfg = compose(config_name, overrides=[f"actor_rollout_ref.model.path={model}", override,
                                              f"trainer.default_local_dir={tmp_path / 'ckpt'}"])
    with pytest.raises(SystemExit) as exit_info:
        run_recipe(cfg, cls)
    assert exit_info.value.code == EXIT_CONFIG_ERROR
    err = capsys.readouterr().err
    assert "Config error" in err and message in err, err
    assert not ray.is_initialized() and not (tmp_path / "ckpt").exists()


def test_recipe_driver_keeps_its_earlier_import_path():
    """Recipes written against ``verl.trainer.preference.driver`` still import the same base class."""
    import verl.trainer.preference.driver as earlier
    import verl.trainer.recipe_driver as base

    assert earlier.RecipeDriver is base.RecipeDriver and earlier.run_recipe is base.run_recipe
    assert earlier.batch_indices(10, 4, 0, 1) == base.batch_indices(10, 4, 0, 1)
