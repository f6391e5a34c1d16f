"""Tool-call parsers: find the calls in a model's turn (verl's ``ToolParser`` registry, ``format`` key).

``hermes`` (Qwen2 family and most open chat templates): each call is ``<tool_call>{"name": ..., "arguments":
{...}}</tool_call>`` in the text. Calls that cannot be used are not dropped silently: malformed JSON, a missing
name, arguments that are not an object, or an unclosed ``<tool_call>`` come back as :class:`ToolCallError`
entries so the agent loop can tell the model what was wrong.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from verl.tools.schemas import OpenAIFunctionParsedSchema

__all__ = ["ToolParser", "HermesToolParser", "ToolCallError"]


@dataclass
class ToolCallError:
    """A call the model tried to make that could not be parsed; ``message`` is shown to the model."""

    message: str
    raw: str = ""


class ToolParser:
    """Base class and registry (``ToolParser.get_tool_parser(name, tokenizer)``)."""

    _registry: dict[str, type] = {}

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer

    @classmethod
    def register(cls, name: str):
        def decorator(subclass):
            cls._registry[name] = subclass
            return subclass
        return decorator

    @classmethod
    def get_tool_parser(cls, name: str, tokenizer) -> "ToolParser":
        if name not in cls._registry:
            raise ValueError(f"actor_rollout_ref.rollout.multi_turn.format={name!r} is not a known tool-call format; "
                             f"use one of {sorted(cls._registry)}")
        return cls._registry[name](tokenizer)

    async def extract_tool_calls(self, responses_ids: list[int]) -> tuple[str, list[OpenAIFunctionParsedSchema]]:
        """verl's interface: (text without the calls, parsed calls). Errors are dropped; use :meth:`parse`."""
        content, calls, _ = self.parse(self.tokenizer.decode(responses_ids, skip_special_tokens=True))
        return content, calls

    def parse(self, text: str) -> tuple[str, list[OpenAIFunctionParsedSchema], list[ToolCallError]]:
        raise NotImplementedError


@ToolParser.register("qwen")  # Qwen2.5 / Qwen3 write hermes' syntax; SGLang's parser of that name reads the same
@ToolParser.register("hermes")
class HermesToolParser(ToolParser):
    start, end = "<tool_call>", "</tool_call>"
    _pattern = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)

    def parse(self, text: str) -> tuple[str, list[OpenAIFunctionParsedSchema], list[ToolCallError]]:
        calls, errors = [], []
        for match in self._pattern.finditer(text):
            raw = match.group(1).strip()
            try:
                obj: Any = json.loads(raw)
            except json.JSONDecodeError as exc:
                errors.append(ToolCallError(f"the tool call is not valid JSON ({exc.msg} at position {exc.pos}); "
                                            f'write <tool_call>{{"name": ..., "arguments": {{...}}}}</tool_call>', raw))
                continue
            if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
                errors.append(ToolCallError('the tool call needs a "name" string', raw))
                continue
            args = obj.get("arguments", {})
            if isinstance(args, str):
                try:
                    args = json.loads(args) if args.strip() else {}
                except json.JSONDecodeError:
                    errors.append(ToolCallError(f'the "arguments" of {obj["name"]} are not valid JSON', raw))
                    continue
            if not isinstance(args, dict):
                errors.append(ToolCallError(f'the "arguments" of {obj["name"]} must be a JSON object', raw))
                continue
            calls.append(OpenAIFunctionParsedSchema(name=obj["name"], arguments=json.dumps(args)))
        rest = self._pattern.sub("", text)
        if self.start in rest:
            errors.append(ToolCallError("a <tool_call> was opened but never closed with </tool_call>",
                                        rest[rest.index(self.start):]))
            rest = rest[: rest.index(self.start)]
        return rest.strip(), calls, errors
