"""Agent loops for ``actor_rollout_ref.rollout.mode=async``: per-sample episodes over the request-level rollout.

Built-in loops (registered on import): ``single_turn_agent``, ``tool_agent``, and the adapters ``openai_agent`` (an
agent function using an OpenAI client against the loopback endpoint) and ``openrlhf_agent`` (an OpenRLHF
``AgentInstance`` file with reset/step). See ``agent_loop.py``.
"""

from .agent_loop import (AGENT_LOOP_REGISTRY, AgentLoopBase, AgentLoopMetrics, AgentLoopOutput, AgentLoopWorker,
                         AsyncLLMServerManager, get_agent_loop_class, register)
from .openai_agent_loop import OpenAIAgentLoop
from .openrlhf_agent_loop import OpenRLHFAgentLoop
from .single_turn_agent_loop import SingleTurnAgentLoop
from .tool_agent_loop import ToolAgentLoop
from .tool_parser import HermesToolParser, ToolParser

__all__ = ["AgentLoopBase", "AgentLoopOutput", "AgentLoopMetrics", "AgentLoopWorker", "AsyncLLMServerManager",
           "register", "get_agent_loop_class", "AGENT_LOOP_REGISTRY", "SingleTurnAgentLoop", "ToolAgentLoop",
           "ToolParser", "HermesToolParser", "OpenAIAgentLoop", "OpenRLHFAgentLoop"]
