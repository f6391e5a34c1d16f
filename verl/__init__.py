"""verl-compatible RL post-training library (HybridFlow single controller + workers).

``import verl`` stays cheap: ``verl.DataProto`` (torch + tensordict) is imported on first access.
"""

__version__ = "0.1.0"

__all__ = ["DataProto", "__version__"]


def __getattr__(name):
    if name == "DataProto":
        # not an optional dependency, but a heavy one: torch + tensordict (~3 s) load on first use of verl.DataProto,
        # so `import verl` (done before any verl submodule) stays cheap
        from verl.protocol import DataProto

        return DataProto
    raise AttributeError(f"module 'verl' has no attribute {name!r}")
