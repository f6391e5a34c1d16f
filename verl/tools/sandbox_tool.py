"""A Python code sandbox tool: runs the model's code in a fresh subprocess and returns what it printed.

The isolation (temporary directory, resource limits, no network, an audit hook, an isolated interpreter) is
:mod:`verl.utils.python_sandbox`'s; its docstring lists the layers. Output (stdout then stderr) is cut to
``max_output_chars`` (default 4096). This is a guard against mistakes and casual escapes of a policy under
training, not a security boundary against a determined attacker: run untrusted production workloads in a
container or VM sandbox.
"""

from __future__ import annotations

from typing import Any, Optional

from verl.utils.python_sandbox import network_namespace_available, run_python

from .base_tool import BaseTool
from .schemas import OpenAIFunctionToolSchema, ToolResponse

__all__ = ["PythonSandboxTool", "run_python", "network_namespace_available"]

DEFAULT_SCHEMA = {
    "type": "function",
    "function": {
        "name": "python",
        "description": "Run Python 3 code and return what it prints (stdout and stderr).",
        "parameters": {"type": "object",
                       "properties": {"code": {"type": "string", "description": "the Python program"}},
                       "required": ["code"]},
    },
}


class PythonSandboxTool(BaseTool):
    """``python(code)`` -> printed output (see the module docstring). Config: ``timeout``, ``memory_limit_mb``,
    ``max_output_chars``, ``isolate_network`` (default true)."""

    def __init__(self, config: dict, tool_schema: Optional[OpenAIFunctionToolSchema] = None):
        if tool_schema is None:
            tool_schema = OpenAIFunctionToolSchema.model_validate(DEFAULT_SCHEMA)
        super().__init__(config, tool_schema)
        self.timeout = float(self.config.get("timeout", 10.0))
        self.memory_limit_mb = int(self.config.get("memory_limit_mb", 512))
        self.max_output_chars = int(self.config.get("max_output_chars", 4096))
        self.isolate_network = bool(self.config.get("isolate_network", True))

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs):
        code = parameters.get("code")
        if not isinstance(code, str) or not code.strip():
            return ToolResponse(text="Error: missing argument 'code' (a string of Python source)"), 0.0, {"error": 1}
        # the sandbox's own wall clock is a little shorter than the agent loop's, so it reports the timeout itself
        result = await run_python(code, timeout=max(0.5, self.timeout - 0.5), memory_limit_mb=self.memory_limit_mb,
                                  max_output_chars=self.max_output_chars, isolate_network=self.isolate_network)
        text = result["stdout"] + (("\n" if result["stdout"] else "") + result["stderr"] if result["stderr"] else "")
        if result["timed_out"]:
            text += f"\nError: the program ran longer than {self.timeout - 0.5:g} s and was stopped"
        error = int(result["timed_out"] or result["returncode"] != 0)
        return ToolResponse(text=text.strip() or "(no output)"), 0.0, {"error": error,
                                                                       "returncode": result["returncode"]}
