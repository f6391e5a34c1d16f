"""``BaseInteraction``: the interface of a simulated user (verl's names and signatures).

Per episode: ``start_interaction(instance_id, **interaction_kwargs)`` -> after each model turn that calls no tool,
``generate_response(instance_id, messages)`` -> ``(should_terminate, response_text, score, extra)``; the text becomes
a user turn (mask 0) unless the interaction ends the episode -> ``finalize_interaction(instance_id)``.
"""

from __future__ import annotations

from typing import Any, Optional
from uuid import uuid4

__all__ = ["BaseInteraction"]


class BaseInteraction:
    def __init__(self, config: dict[str, Any]):
        self.config = dict(config or {})
        self.name: str = self.config.get("name", "interaction_agent")
        self._instance_dict: dict[str, dict] = {}

    async def start_interaction(self, instance_id: Optional[str] = None, **kwargs) -> str:
        instance_id = instance_id or str(uuid4())
        self._instance_dict[instance_id] = dict(kwargs)
        return instance_id

    async def generate_response(self, instance_id: str, messages: list[dict[str, Any]], **kwargs
                                ) -> tuple[bool, str, float, dict[str, Any]]:
        """(should_terminate_sequence, response_content, current_turn_score, additional_data)."""
        return True, "", 0.0, {}

    async def calculate_score(self, instance_id: str, **kwargs) -> float:
        return 0.0

    async def finalize_interaction(self, instance_id: str, **kwargs) -> None:
        self._instance_dict.pop(instance_id, None)
