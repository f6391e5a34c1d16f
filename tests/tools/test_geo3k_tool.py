"""Geo3kTool and the Geometry3K scorer (verl's geo3k example): answers compared by MATH normal form, the format
score for <think>...</think> then a boxed answer, the resubmission penalty, loading from verl's tool config."""

import asyncio
import textwrap

import pytest

from verl.tools.geo3k_tool import Geo3kTool
from verl.tools.utils.tool_registry import initialize_tools_from_config
from verl.utils.reward_score import default_compute_score, geo3k


@pytest.mark.parametrize("predict, truth, use_boxed, expected", [
    ("<think>area</think> so \\boxed{2\\sqrt{3}}", "2\\sqrt3", True, 1.0),        # right, well formatted
    ("so \\boxed{2\\sqrt{3}}", "2\\sqrt{3}", True, 0.9),                          # right, no <think>
    ("<think>x</think> \\boxed{5}", "6", True, 0.1),                              # wrong, well formatted
    ("no box, 6", "6", True, 0.0),                                                # nothing boxed
    ("\\frac{1}{2}", "1/2", False, 0.9),                                          # the whole string is the answer
])
def test_score_is_accuracy_plus_a_format_share(predict, truth, use_boxed, expected):
    assert geo3k.compute_score(predict, truth, use_boxed=use_boxed) == pytest.approx(expected)
    if use_boxed:
        assert default_compute_score("hiyouga/geometry3k", predict, truth) == pytest.approx(expected)


def test_tool_scores_the_submitted_answer_and_penalises_resubmitting(tmp_path):
    path = tmp_path / "geo3k_tool_config.yaml"  # verl's examples/sglang_multiturn/config/tool_config entry
    path.write_text(textwrap.dedent("""
        tools:
          - class_name: verl.tools.geo3k_tool.Geo3kTool
            config: {type: native}
    """))
    [tool] = initialize_tools_from_config(str(path))
    assert isinstance(tool, Geo3kTool) and tool.name == "calc_geo3k_reward"

    async def episode():
        iid, _ = await tool.create(create_kwargs={"ground_truth": "60"})
        wrong = await tool.execute(iid, {"answer": "45"})
        right = await tool.execute(iid, {"answer": "60."})
        again = await tool.execute(iid, {"answer": "60"})
        return wrong, right, again, await tool.calc_reward(iid)

    wrong, right, again, final = asyncio.run(episode())
    assert wrong[1] == -0.05 and "reward=0.0" in wrong[0].text
    assert right[1] == 0.0 and "reward=1.0" in right[0].text
    assert again[1] == -0.05 and final == 1.0
