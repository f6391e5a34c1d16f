"""Tool helpers: loading the tool config yaml (``tool_registry``)."""
