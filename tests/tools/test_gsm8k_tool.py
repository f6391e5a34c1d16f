"""Gsm8kTool (verl's GSM8K answer-checking tool) on the tool base class: scoring, the resubmission penalty, the
ground truth from the row's create_kwargs, and loading it from a tool config file."""

import asyncio
import textwrap

from verl.tools.gsm8k_tool import Gsm8kTool
from verl.tools.utils.tool_registry import initialize_tools_from_config


def run(coro):
    return asyncio.run(coro)


def test_answers_are_scored_and_resubmitting_is_penalised():
    tool = Gsm8kTool({}, None)
    assert tool.name == "calc_gsm8k_reward"

    async def episode():
        iid, _ = await tool.create(ground_truth="72")
        wrong = await tool.execute(iid, {"answer": "70"})
        right = await tool.execute(iid, {"answer": "#### 72"})
        again = await tool.execute(iid, {"answer": 72})  # not an improvement: penalised
        final = await tool.calc_reward(iid)
        await tool.release(iid)
        return wrong, right, again, final, iid in tool._instances

    wrong, right, again, final, kept = run(episode())
    assert wrong[1] == -0.05 and "reward=0.0" in wrong[0].text  # no better than the start (0)
    assert right[1] == 0.0 and "reward=1.0" in right[0].text
    assert again[1] == -0.05 and final == 1.0 and not kept


def test_ground_truth_from_the_rows_create_kwargs():
    tool = Gsm8kTool({}, None)

    async def episode():
        iid, _ = await tool.create(create_kwargs={"ground_truth": "1,234"})  # how the tool agent loop calls it
        await tool.execute(iid, {"answer": "The total is 1234"})
        return await tool.calc_reward(iid)

    assert run(episode()) == 1.0  # flexible extraction: the last number, commas ignored


def test_loads_from_a_tool_config(tmp_path):
    path = tmp_path / "tools.yaml"
    path.write_text(textwrap.dedent("""
        tools:
          - class_name: verl.tools.gsm8k_tool.Gsm8kTool
            config: {type: native}
    """))
    [tool] = initialize_tools_from_config(str(path))
    assert isinstance(tool, Gsm8kTool) and tool.tool_schema.function.parameters.required == ["answer"]
