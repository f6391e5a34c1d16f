import os

import pytest

# Offline, local-only, quiet defaults for every test process (and the Ray workers they start).
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_MODE", "offline")


@pytest.fixture(scope="session")
def tiny_vlm_dir(tmp_path_factory):
    """A tiny Qwen2-VL directory (random weights, tokenizer with vision tokens, image processor), built once."""
    # imported here so that collecting tests which do not use it does not load transformers
    from verl.utils.embedded.vlm import make_vlm_model_dir

    return make_vlm_model_dir(str(tmp_path_factory.mktemp("vlm") / "vlm-tiny"), seed=0)
