import pytest

from verl.utils.reward_score import countdown, gsm8k, gsm_symbolic
from verl.utils.reward_score import math as math_score
from verl.utils.reward_score import math_verify


# ------------------------------------------------------------------------------------------------- gsm8k
@pytest.mark.parametrize("response,truth,expected", [
    ("She pays 3 * 24 = 72.\n#### 72", "72", 1.0),
    ("#### 1,234", "1234", 1.0),
    ("lost money #### -15", "-15", 1.0),
    ("#### $18.", "18", 1.0),
    ("#### 72.0", "72", 1.0),
    ("#### 71", "72", 0.0),
    ("the answer is 72", "72", 0.0),       # strict needs "####"
    ("#### 10 then #### 72", "72", 1.0),   # last one wins
])
def test_gsm8k_strict(response, truth, expected):
    assert gsm8k.compute_score(response, truth, method="strict") == expected


@pytest.mark.parametrize("response,truth,expected", [
    ("so she has 3 apples, then 72 dollars.", "72", 1.0),
    ("total: 1,000", "1000", 1.0),
    ("the change is -7.", "-7", 1.0),
    ("maybe 72 or 73", "72", 0.0),
    ("no digits here", "72", 0.0),
])
def test_gsm8k_flexible(response, truth, expected):
    assert gsm8k.compute_score(response, truth, method="flexible") == expected


def test_gsm8k_format_score_and_score():
    assert gsm8k.compute_score("#### 5", "6", format_score=0.1, score=2.0) == 0.1
    assert gsm8k.compute_score("#### 6", "6", format_score=0.1, score=2.0) == 2.0
    assert gsm8k.compute_score("nothing", "6", format_score=0.1) == 0.0
    with pytest.raises(ValueError, match="strict"):
        gsm8k.extract_solution("#### 1", method="loose")


# -------------------------------------------------------------------------------------------------- MATH
def test_last_boxed_and_remove_boxed():
    s = r"first \boxed{1} then \boxed{\frac{1}{2}} done"
    assert math_score.last_boxed_only_string(s) == r"\boxed{\frac{1}{2}}"
    assert math_score.remove_boxed(r"\boxed{\frac{1}{2}}") == r"\frac{1}{2}"
    assert math_score.last_boxed_only_string(r"so \fbox{7}") == r"\fbox{7}"
    assert math_score.remove_boxed(math_score.last_boxed_only_string(r"$\boxed 9$")) == "9"
    assert math_score.last_boxed_only_string("no box") is None
    assert math_score.last_boxed_only_string(r"\boxed{unclosed") is None


@pytest.mark.parametrize("a,b", [
    (r"\dfrac{1}{2}", r"\frac{1}{2}"),
    (r"\frac12", r"\frac{1}{2}"),
    ("1/2", r"\frac{1}{2}"),
    ("0.5", r"\frac{1}{2}"),
    (".5", "0.5"),
    ("x = 5", "5"),
    (r"10\%", "10"),
    (r"90^\circ", "90"),
    (r"\left( 1, 2 \right)", "(1,2)"),
    (r"\sqrt2", r"\sqrt{2}"),
    (r"5 \text{ cm}", "5"),
    (r"\$3", "3"),
])
def test_math_is_equiv(a, b):
    assert math_score.is_equiv(a, b)


@pytest.mark.parametrize("a,b", [("3", "4"), (r"\frac{1}{3}", r"\frac{1}{2}"), ("x+1", "x-1")])
def test_math_not_equiv(a, b):
    assert not math_score.is_equiv(a, b)


def test_math_compute_score():
    assert math_score.compute_score(r"thus the answer is $\boxed{\dfrac{3}{4}}$.", r"\frac{3}{4}") == 1.0
    assert math_score.compute_score(r"thus $\boxed{5}$", r"\boxed{5}") == 1.0
    assert math_score.compute_score(r"thus $\boxed{6}$", "5") == 0.0
    assert math_score.compute_score("the answer is 5", "5") == 0.0   # MATH requires \boxed


def test_math_verify_symbolic():
    assert math_verify.compute_score(r"so \boxed{\frac{2}{4}}", "0.5") == 1.0
    assert math_verify.compute_score(r"so \boxed{\{2, 1\}}", r"\{1,2\}") == 1.0
    assert math_verify.compute_score(r"so \boxed{\frac{2}{4}}", "0.25") == 0.0
    assert math_verify.compute_score("nonsense ### ???", "3") == 0.0


# --------------------------------------------------------------------------------------------- countdown
GT = {"target": 24, "numbers": [3, 4, 2]}


@pytest.mark.parametrize("response,expected", [
    ("Assistant: think... <answer>(3 * 4) * 2</answer>", 1.0),
    ("<answer>2 * (4 * 3)</answer>", 1.0),
    ("<answer>3 * 4 + 2</answer>", 0.1),              # valid numbers, wrong value
    ("<answer>3 * 4 * 2 * 2</answer>", 0.1),          # 2 used twice
    ("<answer>12 * 2</answer>", 0.1),                 # 12 is not an available number
    ("<answer>3 * 4</answer>", 0.1),                  # 2 not used
    ("<answer>__import__('os')</answer>", 0.1),       # not arithmetic: never evaluated
    ("<answer>3 ** 4 / 2</answer>", 0.1),             # ** is not allowed
    ("<answer>3 / (4 - 4) * 2</answer>", 0.1),        # wrong numbers anyway
    ("(3*4)*2 without tags", 0.0),
])
def test_countdown(response, expected):
    assert countdown.compute_score(response, GT) == expected


def test_countdown_safe_eval():
    assert countdown.safe_eval("(1 + 2) * 3 - 4 / 2") == 7.0
    assert countdown.safe_eval("-3 + 5") == 2.0
    assert countdown.safe_eval("1 / 0") is None
    assert countdown.safe_eval("().__class__") is None
    assert countdown.safe_eval("2 ** 100") is None
    assert countdown.compute_score("<answer>6 / (1 - 3 / 4)</answer>", {"target": 24, "numbers": [6, 1, 3, 4]}) == 1.0


# ------------------------------------------------------------------------------------------- gsm_symbolic
@pytest.mark.parametrize("response,truth,expected", [
    ("<answer>42</answer>", "42", 1.0),
    ("work... #### 1,042", "1042", 1.0),
    (r"so \boxed{-3}", "-3", 1.0),
    ("She ends with 17 marbles.", "17", 1.0),
    ("<answer>41</answer> although 42", "42", 0.0),   # the tagged answer wins
    ("nothing", "42", 0.0),
    ("#### 42", 42, 1.0),                               # integer ground truth
])
def test_gsm_symbolic(response, truth, expected):
    assert gsm_symbolic.compute_score(response, truth) == expected


# ---------------------------------------------------------------------------------------------- math_dapo
@pytest.mark.parametrize("response,truth,score,pred", [
    ("reasoning...\nAnswer: $\\frac{1}{2}$", r"\frac{1}{2}", 1.0, r"\frac{1}{2}"),
    ("Answer: 1,000 dollars", "1000", 1.0, "1000"),
    ("Answer: x = 34", "34", 1.0, "34"),
    ("Answer: 34", "35", -1.0, "34"),
    ("the result is 35", "35", -1.0, ""),
])
def test_math_dapo(response, truth, score, pred):
    from verl.utils.reward_score import math_dapo

    out = math_dapo.compute_score(response, truth)
    assert out == {"score": score, "acc": score > 0, "pred": pred}
    boxed = math_dapo.compute_score(r"so \boxed{\frac12}", r"\frac{1}{2}", strict_box_verify=True)
    assert boxed["acc"] is True
