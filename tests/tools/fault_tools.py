"""Misbehaving tools for the bad-input tests (a tool that raises, one that hangs, one that floods)."""

import asyncio

from verl.tools.base_tool import BaseTool
from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse


def _schema(name):
    return OpenAIFunctionToolSchema.model_validate(
        {"type": "function", "function": {"name": name, "description": name,
                                          "parameters": {"type": "object", "properties": {}, "required": []}}})


class RaisingTool(BaseTool):
    def __init__(self, config, tool_schema=None):
        super().__init__(config, tool_schema or _schema("boom"))

    async def execute(self, instance_id, parameters, **kwargs):
        raise RuntimeError("the tool broke")


class HangingTool(BaseTool):
    def __init__(self, config, tool_schema=None):
        super().__init__(config, tool_schema or _schema("hang"))

    async def execute(self, instance_id, parameters, **kwargs):
        await asyncio.sleep(3600)
        return ToolResponse(text="never"), 0.0, {}


class FloodTool(BaseTool):
    def __init__(self, config, tool_schema=None):
        super().__init__(config, tool_schema or _schema("flood"))

    async def execute(self, instance_id, parameters, **kwargs):
        return ToolResponse(text="A" * 100_000 + "END"), 0.0, {}
