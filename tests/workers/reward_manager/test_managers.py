import pytest
import torch

from verl.workers.reward_manager import (AbstractRewardManager, BatchRewardManager, DAPORewardManager,
                                         NaiveRewardManager, get_reward_manager_cls, register)
from verl.workers.reward_manager.dapo import overlong_penalty

ROWS = [
    ("Q: 2+6?", "it is 8 #### 8", "openai/gsm8k", "8"),
    ("Q: 3*3?", "#### 10", "openai/gsm8k", "9"),
    ("Q: half?", r"\boxed{\frac{1}{2}}", "lighteval/MATH", "0.5"),
    ("Q: make 5", "<answer>2 + 3</answer>", "countdown", {"target": 5, "numbers": [2, 3]}),
]


def test_registry_names_and_error():
    for name, cls in [("naive", NaiveRewardManager), ("batch", BatchRewardManager), ("dapo", DAPORewardManager)]:
        assert get_reward_manager_cls(name) is cls
    assert get_reward_manager_cls("prime").__name__ == "PrimeRewardManager"
    with pytest.raises(ValueError) as err:
        get_reward_manager_cls("nope")
    assert "'nope'" in str(err.value) and "naive" in str(err.value) and "prime" in str(err.value)

    @register("test_constant")
    class Constant(AbstractRewardManager):
        def score_samples(self, samples):
            return [0.5] * len(samples)

    assert get_reward_manager_cls("test_constant") is Constant
    with pytest.raises(ValueError, match="already registered"):
        register("naive")(Constant)


def test_naive_places_scores_at_last_valid_token(char_tokenizer, make_batch, response_lengths):
    data = make_batch(ROWS)
    reward = NaiveRewardManager(char_tokenizer, num_examine=0)(data)
    assert reward.dtype == torch.float32 and reward.shape == data.batch["responses"].shape
    expected = torch.zeros_like(reward)
    for i, (n, s) in enumerate(zip(response_lengths(ROWS), [1.0, 0.0, 1.0, 1.0])):
        expected[i, n - 1] = s
    assert torch.equal(reward, expected)


def test_naive_decodes_valid_tokens_and_passes_fields(char_tokenizer, make_batch):
    seen = []

    def scorer(data_source, solution_str, ground_truth, extra_info=None):
        seen.append((data_source, solution_str, ground_truth, extra_info["index"]))
        return {"score": float(len(solution_str)), "chars": len(solution_str), "tag": solution_str[:2]}

    data = make_batch(ROWS)
    out = NaiveRewardManager(char_tokenizer, 0, compute_score=scorer)(data, return_dict=True)
    assert [s[1] for s in seen] == [r[1] for r in ROWS]    # no pad, no EOS, no prompt text
    assert [s[0] for s in seen] == [r[2] for r in ROWS]
    assert [s[2] for s in seen] == [r[3] for r in ROWS]
    assert [s[3] for s in seen] == [0, 1, 2, 3]
    info = out["reward_extra_info"]
    assert info["chars"] == [len(r[1]) for r in ROWS]
    assert info["tag"] == [r[1][:2] for r in ROWS]
    assert out["reward_tensor"].sum().item() == sum(len(r[1]) for r in ROWS)


def test_naive_reward_fn_key_and_num_examine(char_tokenizer, make_batch, capsys):
    data = make_batch(ROWS + [("Q: again", "#### 1", "openai/gsm8k", "1")])
    data.non_tensor_batch["source2"] = data.non_tensor_batch.pop("data_source")
    mgr = NaiveRewardManager(char_tokenizer, num_examine=1, reward_fn_key="source2")
    mgr(data)
    printed = capsys.readouterr().out
    # one example per data source: gsm8k, MATH, countdown
    assert printed.count("[prompt]") == 3
    assert "Q: 2+6?" in printed and "Q: again" not in printed
    with pytest.raises(KeyError, match="data_source"):
        NaiveRewardManager(char_tokenizer, 0)(data)


def test_rows_without_ground_truth_reach_a_custom_scorer_and_stop_the_built_in_one(char_tokenizer, make_batch):
    data = make_batch(ROWS[:2])
    data.non_tensor_batch["reward_model"][1] = {"style": "rule"}  # no ground_truth (the data lacks the field)
    seen = []
    NaiveRewardManager(char_tokenizer, 0, compute_score=lambda **kw: seen.append(kw["ground_truth"]) or 0.0)(data)
    assert seen == ["8", None]
    with pytest.raises(KeyError, match=r"sample 1 \(data_source='openai/gsm8k'\) has no reward_model.ground_truth.*"
                                       "custom_reward_function.path"):
        NaiveRewardManager(char_tokenizer, 0)(data)
    del data.non_tensor_batch["reward_model"]  # no column at all
    seen.clear()
    NaiveRewardManager(char_tokenizer, 0, compute_score=lambda **kw: seen.append(kw["ground_truth"]) or 0.0)(data)
    assert seen == [None, None]
    with pytest.raises(KeyError, match="no 'reward_model' column"):
        BatchRewardManager(char_tokenizer, 0)(data)


def test_rm_scores_pass_through(char_tokenizer, make_batch):
    data = make_batch(ROWS)
    data.batch["rm_scores"] = torch.full(data.batch["responses"].shape, 0.25)
    out = NaiveRewardManager(char_tokenizer, 0)(data, return_dict=True)
    assert torch.equal(out["reward_tensor"], data.batch["rm_scores"])


def test_unknown_data_source_surfaces_helpful_error(char_tokenizer, make_batch):
    data = make_batch([("Q", "A", "nowhere/dataset", "A")])
    with pytest.raises(NotImplementedError, match="nowhere/dataset"):
        NaiveRewardManager(char_tokenizer, 0)(data)


def test_batch_manager_calls_once_with_lists(char_tokenizer, make_batch, response_lengths):
    calls = []

    def batched(data_sources, solution_strs, ground_truths, extra_infos, bonus=0.0):
        calls.append(len(solution_strs))
        return [{"score": float(s == "#### 10") + bonus, "n": i} for i, s in enumerate(solution_strs)]

    data = make_batch(ROWS)
    out = BatchRewardManager(char_tokenizer, 0, compute_score=batched, bonus=0.5)(data, return_dict=True)
    assert calls == [4]
    lens = response_lengths(ROWS)
    assert out["reward_tensor"][1, lens[1] - 1].item() == 1.5
    assert out["reward_tensor"][0, lens[0] - 1].item() == 0.5
    assert out["reward_extra_info"]["n"] == [0, 1, 2, 3]

    # without a custom function the built-in scorer is applied element-wise
    default = BatchRewardManager(char_tokenizer, 0)(data)
    assert torch.equal(default, NaiveRewardManager(char_tokenizer, 0)(data))

    with pytest.raises(ValueError, match="one score per sample"):
        BatchRewardManager(char_tokenizer, 0, compute_score=lambda **kw: [1.0])(data)


def test_dapo_overlong_penalty_hand_computed(char_tokenizer, make_batch):
    # max_resp_len=20, buffer=8 -> responses longer than 12 tokens are penalised, linearly to -factor at 20.
    rows = [
        ("Q", "#### 8", "openai/gsm8k", "8"),                    # 6 chars + EOS = 7 tokens: no penalty
        ("Q", "so it is... #### 8", "openai/gsm8k", "8"),        # 18 + 1 = 19 tokens
        ("Q", "wrong wrong #### 9", "openai/gsm8k", "8"),        # 19 tokens, score 0
    ]
    data = make_batch(rows, resp_len=24)
    cfg = {"enable": True, "len": 8, "penalty_factor": 2.0, "log": True}
    mgr = DAPORewardManager(char_tokenizer, 0, max_resp_len=20, overlong_buffer_cfg=cfg)
    out = mgr(data, return_dict=True)
    r = out["reward_tensor"]
    p19 = -(19 - (20 - 8)) / 8 * 2.0    # = -1.75
    assert overlong_penalty(19, 20, 8, 2.0) == pytest.approx(p19)
    assert overlong_penalty(7, 20, 8, 2.0) == 0.0
    assert r[0, 6].item() == pytest.approx(1.0)
    assert r[1, 18].item() == pytest.approx(1.0 + p19)
    assert r[2, 18].item() == pytest.approx(0.0 + p19)
    assert r.count_nonzero().item() == 3
    info = out["reward_extra_info"]
    assert info["acc"] == [1.0, 1.0, 0.0]
    assert info["overlong"] == [False, True, True]
    assert info["overlong_reward"] == pytest.approx([0.0, p19, p19])

    plain = DAPORewardManager(char_tokenizer, 0, max_resp_len=20, overlong_buffer_cfg={"enable": False})(data)
    assert plain[1, 18].item() == 1.0

    with pytest.raises(ValueError, match="max_resp_len"):
        DAPORewardManager(char_tokenizer, 0, overlong_buffer_cfg=cfg)
    with pytest.raises(ValueError, match="must be >="):
        DAPORewardManager(char_tokenizer, 0, max_resp_len=4, overlong_buffer_cfg=cfg)


def test_mixed_float_and_dict_results_stay_aligned(char_tokenizer, make_batch):
    def scorer(data_source, solution_str, ground_truth, extra_info=None):
        if extra_info["index"] % 2:
            return 0.25
        return {"score": 1.0, "pred": solution_str[-1], "acc": True}

    out = NaiveRewardManager(char_tokenizer, 0, compute_score=scorer)(make_batch(ROWS), return_dict=True)
    info = out["reward_extra_info"]
    assert info["score"] == [1.0, 0.25, 1.0, 0.25]
    assert info["acc"] == [True, 0.0, True, 0.0]
    assert info["pred"] == ["8", "", "}", ""]
    assert out["reward_tensor"].sum().item() == 2.5
