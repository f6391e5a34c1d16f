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


def test_push_info_lines_are_dropped_inside_the_block_only():
    from verl.utils.vllm_utils import PUSH_INFO_LOGGERS, quiet_push_info_logs

    loggers = [logging.getLogger(name) for name in PUSH_INFO_LOGGERS]
    handler = Collect()
    old = [lg.level for lg in loggers]
    for lg in loggers:
        lg.addHandler(handler)
        lg.setLevel(logging.DEBUG)
    try:
        with quiet_push_info_logs():
            loggers[0].info("Reloading and processing weights took %.2f seconds", 0.04)
            loggers[1].info("Successfully reset prefix cache")
            loggers[1].warning("Successfully reset prefix cache")  # not an info line: kept
            loggers[0].info("something else")  # kept
        loggers[1].info("Successfully reset prefix cache")  # outside the block: kept
    finally:
        for lg, level in zip(loggers, old):
            lg.removeHandler(handler)
            lg.setLevel(level)
    assert handler.messages == ["Successfully reset prefix cache", "something else", "Successfully reset prefix cache"]
    assert all(lg.filters == [] for lg in loggers)


def test_push_info_messages_match_the_installed_vllm_source():
    from verl.utils.vllm_utils import PUSH_INFO_LOGGERS

    spec = importlib.util.find_spec("vllm")
    if spec is None:
        pytest.skip("vllm not installed")
    texts = [(Path(spec.origin).parent / Path(*name.split(".")[1:]).with_suffix(".py")).read_text()
             for name in PUSH_INFO_LOGGERS]
    assert '"Reloading and processing weights took %.2f seconds"' in texts[0]
    assert 'logger.info("Successfully reset prefix cache")' in texts[1]
