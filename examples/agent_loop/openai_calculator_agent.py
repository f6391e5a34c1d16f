"""An agent written against the OpenAI client, trained as it is with ``openai_agent``.

It offers the model a calculator tool in OpenAI's function-calling format, runs the calls the model makes, sends
the results back, and scores the final answer against the row's ground truth. Outside training the same function
runs against any OpenAI-compatible server (``openai.AsyncOpenAI(base_url=..., api_key=...)``).

Run it with ``openai_agent`` (see examples/agent_loop/agent_loops.yaml and docs/multiturn.md).
"""

import json
import re

from verl.tools.calculator_tool import CalculatorError, format_number, safe_eval

TOOLS = [{
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression, e.g. 12*34.",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                       "required": ["expression"]},
    },
}]
MAX_ROUNDS = 3


def calculator(arguments: str) -> str:
    try:
        return format_number(safe_eval(json.loads(arguments)["expression"]))
    except (CalculatorError, KeyError, TypeError, ValueError) as exc:
        return f"Error: {exc}"


async def run_agent(client, row):
    """One episode: returns the reward (1.0 if the last number in the final answer is the ground truth)."""
    messages = list(row["raw_prompt"])
    answer = ""
    for _ in range(MAX_ROUNDS):
        reply = await client.chat.completions.create(model="policy", messages=messages, tools=TOOLS,
                                                     max_tokens=128)
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            answer = message.content or ""
            break
        for call in message.tool_calls:
            messages.append({"role": "tool", "tool_call_id": call.id,
                             "content": calculator(call.function.arguments)})
    numbers = re.findall(r"-?\d+", answer.replace(",", ""))
    return 1.0 if numbers and numbers[-1] == str(row["reward_model"]["ground_truth"]) else 0.0
