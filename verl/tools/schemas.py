"""Tool schemas in OpenAI's function-calling format (what the chat template shows the model) and the tool
response type (verl's names)."""

from __future__ import annotations

from typing import Any, Literal, Optional

from pydantic import BaseModel, Field

__all__ = ["OpenAIFunctionPropertySchema", "OpenAIFunctionParametersSchema", "OpenAIFunctionSchema",
           "OpenAIFunctionToolSchema", "OpenAIFunctionParsedSchema", "OpenAIFunctionToolCall", "ToolResponse"]


class OpenAIFunctionPropertySchema(BaseModel):
    """One argument: its JSON type, description and allowed values."""

    type: str
    description: Optional[str] = None
    enum: Optional[list[str]] = None


class OpenAIFunctionParametersSchema(BaseModel):
    type: str = "object"
    properties: dict[str, OpenAIFunctionPropertySchema] = Field(default_factory=dict)
    required: list[str] = Field(default_factory=list)


class OpenAIFunctionSchema(BaseModel):
    name: str
    description: str = ""
    parameters: OpenAIFunctionParametersSchema = Field(default_factory=OpenAIFunctionParametersSchema)
    strict: bool = False


class OpenAIFunctionToolSchema(BaseModel):
    """``{"type": "function", "function": {name, description, parameters}}``."""

    type: Literal["function"] = "function"
    function: OpenAIFunctionSchema


class OpenAIFunctionParsedSchema(BaseModel):
    """A call as the parser found it in the model's text: the name and the raw JSON arguments string."""

    name: str
    arguments: str


class OpenAIFunctionToolCall(BaseModel):
    id: str = ""
    type: Literal["function"] = "function"
    function: OpenAIFunctionParsedSchema


class ToolResponse(BaseModel):
    """What a tool hands back to the model: text (and, for multimodal models, images / videos)."""

    text: Optional[str] = None
    image: Optional[list[Any]] = None
    video: Optional[list[Any]] = None
