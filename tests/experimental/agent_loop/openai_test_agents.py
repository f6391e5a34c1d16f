"""Agent functions for the openai_agent tests: each drives the loopback endpoint with a real OpenAI client."""

import json

RETRY = "Check your answer and reply again."


async def two_turns(client, row):
    """Ask, then add a user turn and ask again (a continued conversation: one trajectory)."""
    assert row["reward_model"]["ground_truth"], row  # every row field reaches the agent
    messages = list(row["raw_prompt"])
    first = await client.chat.completions.create(model="policy", messages=messages, max_tokens=24, logprobs=True)
    assert len(first.choices[0].logprobs.content) == first.usage.completion_tokens
    messages += [first.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": RETRY}]
    second = await client.chat.completions.create(model="policy", messages=messages, max_tokens=24)
    text = second.choices[0].message.content or ""
    return 0.25 + 0.5 * (len(text) % 2)


async def with_tool(client, row):
    """One function call: the model's call comes back as tool_calls, the result goes back as a tool message."""
    tools = [{"type": "function", "function": {"name": "calculator", "description": "arithmetic",
                                               "parameters": {"type": "object",
                                                              "properties": {"expression": {"type": "string"}}}}}]
    messages = list(row["raw_prompt"])
    first = await client.chat.completions.create(model="policy", messages=messages, tools=tools)
    message = first.choices[0].message
    assert first.choices[0].finish_reason == "tool_calls", first
    call = message.tool_calls[0]
    assert call.function.name == "calculator" and json.loads(call.function.arguments) == {"expression": "123*456"}
    messages += [message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": "56088"}]
    second = await client.chat.completions.create(model="policy", messages=messages, tools=tools)
    return 1.0 if "56088" in (second.choices[0].message.content or "") else 0.0


async def restart(client, row):
    """Two unrelated conversations: the episode keeps the second."""
    await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "first"}])
    await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "second"}])
    return None


async def until_refused(client, row):
    """Keeps adding user turns until the endpoint refuses for lack of room (ends the episode normally)."""
    messages = list(row["raw_prompt"])
    while True:
        reply = await client.chat.completions.create(model="policy", messages=messages)
        messages += [reply.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": RETRY}]


async def raises(client, row):
    await client.chat.completions.create(model="policy", messages=list(row["raw_prompt"]))
    raise RuntimeError("the agent broke")


async def completions(client, row):
    """The legacy completions route: a text prompt continued with more text."""
    first = await client.completions.create(model="policy", prompt="Q: 2+2?\nA:", max_tokens=8, logprobs=1)
    text = "Q: 2+2?\nA:" + first.choices[0].text + "\nQ: 3+3?\nA:"
    await client.completions.create(model="policy", prompt=text, max_tokens=8)
    return 0.5


def not_async(client, row):
    return 0.0
