"""``BaseTool``: the interface every tool implements (verl's names and signatures).

Life of a tool in one episode: ``create`` (per-episode state, e.g. the ground truth from the row's
``tools_kwargs``) -> ``execute`` once per call the model makes -> ``calc_reward`` (optional) -> ``release``.
All four are coroutines so that many episodes can run concurrently; a tool doing blocking work should move it
off the event loop (``asyncio.to_thread`` or a subprocess).

``config`` is the ``config`` dict of the tool's entry in the tool config yaml; keys every tool understands:
``timeout`` (seconds one ``execute`` may take before the agent loop reports a timeout to the model, default 30).
"""

from __future__ import annotations

from typing import Any, Optional
from uuid import uuid4

from .schemas import OpenAIFunctionToolSchema, ToolResponse

__all__ = ["BaseTool"]


class BaseTool:
    """Base class of tools (subclass it and override ``execute``; see the module docstring)."""

    def __init__(self, config: dict, tool_schema: Optional[OpenAIFunctionToolSchema]):
        self.config = dict(config or {})
        self.tool_schema = tool_schema or self.get_openai_tool_schema()
        if self.tool_schema is None:
            raise ValueError(f"{type(self).__name__}: no tool_schema given and the class defines none")
        self.name = self.tool_schema.function.name
        self.timeout = float(self.config.get("timeout", 30.0))
        self._instances: dict[str, dict] = {}

    def get_openai_tool_schema(self) -> Optional[OpenAIFunctionToolSchema]:
        """The OpenAI function schema the chat template shows the model."""
        return getattr(self, "tool_schema", None)

    async def create(self, instance_id: Optional[str] = None, **kwargs) -> tuple[str, ToolResponse]:
        """Start the per-episode state; returns (instance id, an optional first response). The agent loop
        calls ``create(create_kwargs=row.tools_kwargs[name].create_kwargs)``."""
        instance_id = instance_id or str(uuid4())
        self._instances[instance_id] = dict(kwargs.get("create_kwargs", {}) or {})
        return instance_id, ToolResponse()

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs) -> tuple[ToolResponse, float,
                                                                                             dict]:
        """Run one call; returns (response for the model, step reward, metrics)."""
        return ToolResponse(text="Updated the tool state."), 0.0, {}

    async def calc_reward(self, instance_id: str, **kwargs) -> float:
        """A reward from the tool's state at the end of the episode (default 0)."""
        return 0.0

    async def release(self, instance_id: str, **kwargs) -> None:
        """Drop the per-episode state."""
        self._instances.pop(instance_id, None)
