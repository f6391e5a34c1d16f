"""Tools for multi-turn rollouts: the ``BaseTool`` interface, the tool config loader, and shipped tools
(``calculator_tool.CalculatorTool``, ``sandbox_tool.PythonSandboxTool``, ``search_tool.BM25SearchTool``).

Tool modules are imported by their ``class_name`` from the tool config yaml, so importing this package stays light.
"""

from .base_tool import BaseTool
from .schemas import OpenAIFunctionToolSchema, ToolResponse

__all__ = ["BaseTool", "OpenAIFunctionToolSchema", "ToolResponse"]
