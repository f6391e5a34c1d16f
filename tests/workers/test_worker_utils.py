"""verl.workers.worker_utils: joining the process group with the configured timeout."""

import datetime

import torch.distributed as dist

from verl.workers import worker_utils


def _join(monkeypatch, timeout_seconds):
    seen = {}
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", lambda **kwargs: seen.update(kwargs))
    monkeypatch.setattr(worker_utils, "set_device", lambda rank: None)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    worker_utils.init_distributed(timeout_seconds)
    return seen


def test_nccl_timeout_reaches_the_process_group(monkeypatch):
    """actor_rollout_ref.nccl_timeout (seconds) becomes the process group's timeout; unset keeps torch's default."""
    assert _join(monkeypatch, 1800)["timeout"] == datetime.timedelta(seconds=1800)
    seen = _join(monkeypatch, None)
    assert "timeout" not in seen and seen["rank"] == 1 and seen["world_size"] == 2


def test_custom_chat_template_replaces_the_tokenizers(tmp_path):
    """actor_rollout_ref.model.custom_chat_template: the workers' tokenizer (which the agent loops render turns
    with) and the TaskRunner's (which renders the prompts) both use it."""
    from omegaconf import OmegaConf

    from verl.trainer.config_schema.ppo import PPOTrainerConfig
    from verl.trainer.config_schema.spec import build
    from verl.trainer.task_runner import load_tokenizer_and_processor
    from verl.utils.embedded import make_model_dir

    model = make_model_dir(str(tmp_path / "m"), size="tiny", seed=0)
    template = "<<{% for m in messages %}{{ m['content'] }}{% endfor %}>>"
    messages = [{"role": "user", "content": "1+1"}]
    assert worker_utils.load_tokenizer(model).apply_chat_template(messages, tokenize=False) != "<<1+1>>"
    assert worker_utils.load_tokenizer(model, chat_template=template).apply_chat_template(
        messages, tokenize=False) == "<<1+1>>"
    config = OmegaConf.create({"data": {}, "actor_rollout_ref": {"model": {"path": model,
                                                                            "custom_chat_template": template}}})
    tokenizer, _ = load_tokenizer_and_processor(build(PPOTrainerConfig, config))
    assert tokenizer.apply_chat_template(messages, tokenize=False) == "<<1+1>>"
