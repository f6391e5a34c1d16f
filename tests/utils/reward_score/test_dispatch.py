import pytest

from verl.utils.reward_score import (UnknownDataSourceError, arithmetic, default_compute_score, register_score_fn,
                                     supported_data_sources)


@pytest.mark.parametrize("data_source,response,truth", [
    ("openai/gsm8k", "#### 8", "8"),
    ("lighteval/MATH", r"\boxed{\dfrac{1}{2}}", r"\frac{1}{2}"),
    ("DigitalLearningGmbH/MATH-lighteval", r"\boxed{2/4}", r"\frac{1}{2}"),   # needs math-verify
    ("HuggingFaceH4/MATH-500", r"\boxed{3}", "3"),
    ("countdown", "<answer>1 + 2</answer>", {"target": 3, "numbers": [1, 2]}),
    ("gsm_symbolic", "<answer>7</answer>", "7"),
])
def test_dispatch_correct_and_wrong(data_source, response, truth):
    assert default_compute_score(data_source, response, truth) == 1.0
    assert default_compute_score(data_source, "I do not know", truth) == 0.0
    assert isinstance(default_compute_score(data_source, response, truth, extra_info={"split": "test"}), float)


def test_dispatch_forwards_known_kwargs_and_drops_others():
    # gsm8k's `method` is forwarded; verl's sandbox options are accepted and ignored.
    assert default_compute_score("openai/gsm8k", "it is 8", "8") == 0.0
    assert default_compute_score("openai/gsm8k", "it is 8", "8", method="flexible") == 1.0
    assert default_compute_score("openai/gsm8k", "#### 8", "8", sandbox_fusion_url=None,
                                 concurrent_semaphore=None) == 1.0


def test_arithmetic_dispatches_to_its_module(monkeypatch):
    calls = []

    def fake(solution_str, ground_truth):
        calls.append((solution_str, ground_truth))
        return 0.75

    monkeypatch.setattr(arithmetic, "compute_score", fake)
    assert default_compute_score("arithmetic", "= 12", "12") == 0.75
    assert calls == [("= 12", "12")]


def test_arithmetic_real_scorer():
    assert default_compute_score("arithmetic", "19<|im_end|>", "19") == 1.0
    assert default_compute_score("arithmetic", "20", "19") == 0.0
    assert default_compute_score("arithmetic", "20", "19", format_score=0.1) == 0.1


def test_unknown_data_source_error_is_helpful():
    with pytest.raises(NotImplementedError) as err:
        default_compute_score("my_org/riddles", "x", "y")
    msg = str(err.value)
    assert isinstance(err.value, UnknownDataSourceError)
    assert "'my_org/riddles'" in msg
    assert "openai/gsm8k" in msg and "countdown" in msg
    assert "custom_reward_function.path" in msg


def test_register_score_fn_and_dict_results():
    @register_score_fn("test/dict_scorer")
    def _scorer(solution_str, ground_truth, extra_info=None):
        return {"score": int(solution_str == ground_truth), "acc": solution_str == ground_truth}

    assert "test/dict_scorer" in supported_data_sources()
    out = default_compute_score("test/dict_scorer", "a", "a")
    assert out == {"score": 1.0, "acc": True} and isinstance(out["score"], float)
    with pytest.raises(ValueError):
        register_score_fn()


def test_prefix_dispatch_for_aime_and_math_dapo():
    assert default_compute_score("aime2024", "Answer: 204", "204") == {"score": 1.0, "acc": True, "pred": "204"}
    assert default_compute_score("math_dapo", "Answer: 5", "204")["score"] == -1.0
    assert "aime*" in supported_data_sources()
    with pytest.raises(NotImplementedError, match="aime\\*"):
        default_compute_score("aim", "x", "y")


def test_sequence_result_is_rejected_not_truncated():
    @register_score_fn("test/tuple_scorer")
    def _scorer(solution_str, ground_truth, extra_info=None):
        return (1.0, {"acc": True})

    with pytest.raises(TypeError, match=r"'test/tuple_scorer'.*return a float or a dict with 'score'"):
        default_compute_score("test/tuple_scorer", "a", "a")


def test_require_score_fn():
    from verl.utils.reward_score import get_score_fn, require_score_fn

    assert require_score_fn("openai/gsm8k") is get_score_fn("openai/gsm8k")
    with pytest.raises(UnknownDataSourceError, match="custom_reward_function.path"):
        require_score_fn("my_org/riddles")
