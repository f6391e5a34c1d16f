"""Load tools from verl's tool config yaml (``actor_rollout_ref.rollout.multi_turn.tool_config_path``)::

    tools:
      - class_name: verl.tools.calculator_tool.CalculatorTool   # import path of a BaseTool subclass
        config: {type: native, timeout: 5}                       # handed to the tool's __init__
        tool_schema:                                             # OpenAI function schema (optional if the class has one)
          type: function
          function: {name: calculator, description: ..., parameters: {type: object, properties: {...}, required: [...]}}

:func:`load_tool_config` checks the file (every problem is a ``ToolConfigError`` naming the file, the entry and
the key) without importing any tool, so a run can fail before its workers start; :func:`initialize_tools_from_config`
builds the tools. ``type: mcp`` (tools served by MCP servers) is not available here and is refused.
"""

from __future__ import annotations

import importlib
import os
from typing import Any, Optional

from omegaconf import OmegaConf
from pydantic import ValidationError

from ..base_tool import BaseTool
from ..schemas import OpenAIFunctionToolSchema

__all__ = ["ToolConfigError", "load_tool_config", "check_tool_config", "initialize_tools_from_config",
           "get_tool_class"]

TOOL_CONFIG_KEY = "actor_rollout_ref.rollout.multi_turn.tool_config_path"


class ToolConfigError(ValueError):
    """The tool config yaml is missing, malformed, or names a tool that cannot be built."""


def load_tool_config(path: str, key: str = TOOL_CONFIG_KEY) -> list[dict]:
    """The ``tools`` entries of a tool config file, checked (see the module docstring); errors name ``key``."""
    where = f"{key}={path}"
    full = os.path.expanduser(str(path))
    if not os.path.isfile(full):
        raise ToolConfigError(f"{where}: no such file; point it at a yaml file with a top-level 'tools:' list")
    try:
        raw = OmegaConf.to_container(OmegaConf.load(full), resolve=True)
    except Exception as exc:  # yaml syntax errors come in several exception types
        raise ToolConfigError(f"{where}: not valid yaml: {exc}") from exc
    if not isinstance(raw, dict) or not isinstance(raw.get("tools"), list):
        raise ToolConfigError(f"{where}: expected a top-level 'tools:' list of entries with class_name, config "
                              f"and tool_schema")
    entries, names = [], set()
    for i, entry in enumerate(raw["tools"]):
        label = f"{where}: tools[{i}]"
        if not isinstance(entry, dict):
            raise ToolConfigError(f"{label} must be a mapping with class_name, config, tool_schema")
        class_name = entry.get("class_name")
        if not class_name or not isinstance(class_name, str) or "." not in class_name:
            raise ToolConfigError(f"{label} has no class_name; give the import path of a BaseTool subclass, e.g. "
                                  f"class_name: verl.tools.calculator_tool.CalculatorTool")
        config = entry.get("config") or {}
        if not isinstance(config, dict):
            raise ToolConfigError(f"{label}.config must be a mapping, got {type(config).__name__}")
        tool_type = str(config.get("type", "native"))
        if tool_type != "native":
            raise ToolConfigError(f"{label}.config.type={tool_type!r}: only native tools are available here "
                                  f"(MCP tool servers are not); use type: native")
        schema = entry.get("tool_schema")
        if schema is not None:
            try:
                schema = OpenAIFunctionToolSchema.model_validate(schema)
            except ValidationError as exc:
                raise ToolConfigError(f"{label}.tool_schema is not an OpenAI function schema "
                                      f"(type: function, function: {{name, description, parameters}}): {exc}") from exc
            if schema.function.name in names:
                raise ToolConfigError(f"{label}: a second tool named {schema.function.name!r}; tool names must be "
                                      f"unique")
            names.add(schema.function.name)
        entries.append({"class_name": class_name, "config": config, "tool_schema": schema})
    return entries


def get_tool_class(class_name: str, where: str = "") -> type:
    """Import ``pkg.module.Class`` and check it is a :class:`BaseTool`."""
    module_name, _, attr = class_name.rpartition(".")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ToolConfigError(f"{where}class_name={class_name}: cannot import {module_name}: {exc}") from exc
    cls = getattr(module, attr, None)
    if not (isinstance(cls, type) and issubclass(cls, BaseTool)):
        raise ToolConfigError(f"{where}class_name={class_name}: {attr} is not a BaseTool subclass in {module_name}")
    return cls


def check_tool_config(path: str, key: str = TOOL_CONFIG_KEY) -> None:
    """Load the file and import every tool class without building any (the driver's check before workers start);
    errors name ``key``."""
    for i, entry in enumerate(load_tool_config(str(path), key)):
        get_tool_class(entry["class_name"], f"{key}={path}: tools[{i}] ")


def initialize_tools_from_config(tools_config_file: Optional[str], key: str = TOOL_CONFIG_KEY) -> list[BaseTool]:
    """Build every tool of the config file (none for a null path); errors name ``key``."""
    if not tools_config_file:
        return []
    tools: list[BaseTool] = []
    seen: set[str] = set()
    for i, entry in enumerate(load_tool_config(tools_config_file, key)):
        where = f"{key}={tools_config_file}: tools[{i}] "
        cls = get_tool_class(entry["class_name"], where)
        tool = cls(config=entry["config"], tool_schema=entry["tool_schema"])
        if tool.name in seen:
            raise ToolConfigError(f"{where}: a second tool named {tool.name!r}; tool names must be unique")
        seen.add(tool.name)
        tools.append(tool)
    return tools


def tool_schemas(tools: list[BaseTool]) -> list[dict[str, Any]]:
    """The tools' OpenAI schemas as plain dicts (what ``apply_chat_template(tools=...)`` takes)."""
    return [t.tool_schema.model_dump(exclude_none=True) for t in tools]
