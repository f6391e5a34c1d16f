"""vLLM's per-reload rotary warning is dropped around our reload call; every other record still gets through."""

import importlib.util
import logging
from pathlib import Path

import pytest

from verl.utils.vllm_utils import RELOAD_LOGGER, quiet_rotary_reload_warning


class Collect(logging.Handler):
    def __init__(self):
        super().__init__()
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


@pytest.fixture
def vllm_reload_log():
    logger = logging.getLogger(RELOAD_LOGGER)
    handler = Collect()
    logger.addHandler(handler)
    old_level = logger.level
    logger.setLevel(logging.DEBUG)
    yield logger, handler.messages
    logger.removeHandler(handler)
    logger.setLevel(old_level)


def test_only_the_rotary_record_is_dropped_and_only_inside_the_block(vllm_reload_log):
    logger, seen = vllm_reload_log
    with quiet_rotary_reload_warning():
        logger.warning("%s: Failed to load weights", "RotaryEmbedding")
        logger.warning("%s: Failed to load weights", "Llama3RotaryEmbedding")
        logger.warning("%s: Failed to load weights", "QKVParallelLinear")  # a real missing weight: kept
        logger.warning("Following weights were not loaded from checkpoint: %s", {"lm_head.weight"})
    logger.warning("%s: Failed to load weights", "RotaryEmbedding")  # outside the block: kept
    assert seen == ["QKVParallelLinear: Failed to load weights",
                    "Following weights were not loaded from checkpoint: {'lm_head.weight'}",
                    "RotaryEmbedding: Failed to load weights"]
    assert logger.filters == []


def test_filter_matches_the_installed_vllm_source():
    """The logger name and message format the filter relies on are what the installed vLLM uses."""
    spec = importlib.util.find_spec("vllm")
    if spec is None:
        pytest.skip("vllm not installed")
    source = Path(spec.origin).parent / Path(*RELOAD_LOGGER.split(".")[1:]).with_suffix(".py")
    text = source.read_text()
    assert "logger = init_logger(__name__)" in text
    assert 'logger.warning("%s: Failed to load weights", layer.__class__.__name__)' in text
