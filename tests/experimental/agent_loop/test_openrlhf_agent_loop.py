"""openrlhf_agent against a scripted engine (pure logic: the model's turns are fixed strings; tokenizer, agent files
and packing are real): the token layout (feedback tokens mask 0, exactly the tokenized feedback), the summed
reward as the episode's reward_score (used by the reward manager in place of the reward function), OpenRLHF's
state dicts, module-level reset/step, files without the interface, and a step that raises."""

import asyncio
import os
import sys
import textwrap

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from verl.experimental.agent_loop import AgentLoopWorker, OpenRLHFAgentLoop
from verl.experimental.agent_loop.agent_loop import AgentLoopOutput, _TrainerConfig
from verl.experimental.agent_loop.config import check_agent_loop_config
from verl.experimental.agent_loop.metrics import agent_loop_metrics
from verl.experimental.agent_loop.openrlhf_agent_loop import load_openrlhf_agent
from verl.protocol import DataProto
from verl.utils.config import ConfigError
from verl.utils.embedded.tokenizer import load_tokenizer
from verl.workers.reward_manager.naive import NaiveRewardManager
from verl.workers.rollout.async_server import TokenOutput

HERE = os.path.dirname(os.path.abspath(__file__))
ENV = os.path.join(HERE, "openrlhf_test_env.py")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
QUESTION = [{"role": "user", "content": "What is 123*456?"}]


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer()


class ScriptedServer:
    def __init__(self, tok, script):
        self.tok, self.script, self.prompts, self.params = tok, script, [], []

    async def generate(self, request_id, *, prompt_ids, sampling_params):
        text = self.script[min(len(self.prompts), len(self.script) - 1)]
        self.prompts.append(list(prompt_ids))
        self.params.append(dict(sampling_params))
        ids = self.tok.encode(text, add_special_tokens=False) + [self.tok.eos_token_id]
        ids = ids[: sampling_params["max_tokens"]]
        return TokenOutput(token_ids=ids, log_probs=[-(i + 1) / 1000 for i in range(len(ids))])


def config(response_length=200):
    return OmegaConf.create({"rollout": dict(name="hf", n=1, prompt_length=64, response_length=response_length)})


def run(tok, path, script, response_length=200, **loop_kwargs):
    server = ScriptedServer(tok, script)
    loop = OpenRLHFAgentLoop(_TrainerConfig(config(response_length)), server, tok, agent_func_path=path, **loop_kwargs)
    ids = tok.encode(tok.apply_chat_template(QUESTION, tokenize=False, add_generation_prompt=True))
    row = {"raw_prompt": QUESTION, "raw_prompt_ids": ids, "reward_model": {"ground_truth": "56088"}}
    run.loop = loop
    return asyncio.run(loop.run({"temperature": 1.0}, **row)), server, ids


def test_feedback_is_masked_and_rewards_add_up(tok):
    out, server, prompt_ids = run(tok, ENV, ["It is 5.", "It is 56088"], max_tokens_per_turn=30)
    env = run.loop.agent_file.module  # the file as the loop loaded it
    a1 = tok.encode("It is 5.", add_special_tokens=False) + [tok.eos_token_id]
    fb = tok.encode(env.FEEDBACK, add_special_tokens=False)
    a2 = tok.encode("It is 56088", add_special_tokens=False) + [tok.eos_token_id]
    assert out.prompt_ids == prompt_ids  # reset kept the observation: the dataset's tokens are used as they are
    assert out.response_ids == a1 + fb + a2  # the feedback given with done=True is not appended
    assert out.response_mask == [1] * len(a1) + [0] * len(fb) + [1] * len(a2)
    assert out.response_logprobs[len(a1):len(a1) + len(fb)] == [0.0] * len(fb)
    assert out.reward_score == pytest.approx(0.1 + 0.25 + 0.5 * (len("It is 56088") % 2))
    assert out.num_turns == 4 and out.extra_fields["env_steps"] == 2 and out.extra_fields["env_errors"] == 0
    assert out.extra_fields["extra_logs"] == {"step": 2.0}
    # OpenRLHF's states: the observation text grows by action + feedback; the label is the ground truth
    prompt_text = tok.decode(prompt_ids)
    assert env.LOG == [(prompt_text, "It is 5.", "56088"), (prompt_text + "It is 5." + env.FEEDBACK, "It is 56088",
                                                            "56088")]
    assert server.prompts[1] == prompt_ids + a1 + fb
    assert [p["max_tokens"] for p in server.params] == [30, 30]


def test_module_level_functions_and_changed_observation(tok, tmp_path):
    path = tmp_path / "module_env.py"
    path.write_text(textwrap.dedent('''
        async def reset(states, **kwargs):
            return {"observation": "Solve: " + states["label"] + "\\n"}

        async def step(states, **kwargs):
            return {"rewards": 0.5, "environment_feedback": "", "done": True}
        '''))
    out, server, _ = run(tok, str(path), ["ok"])
    assert out.prompt_ids == tok.encode("Solve: 56088\n", add_special_tokens=False)
    assert out.reward_score == 0.5 and out.response_mask == [1] * len(out.response_ids)


def test_async_init_and_the_openrlhf_import_work_without_openrlhf(tok, tmp_path):
    path = tmp_path / "async_init_env.py"
    path.write_text(textwrap.dedent('''
        import torch
        from openrlhf.utils.agent import AgentExecutorBase, AgentInstanceBase

        class AgentInstance(AgentInstanceBase):
            async def __init__(self, *args, **kwargs):
                self.bonus = 2.0

            async def step(self, states, **kwargs):
                return {"rewards": torch.tensor(self.bonus), "environment_feedback": "", "done": True}

        class AgentExecutor(AgentExecutorBase):
            def __init__(self, max_steps, max_length, llm_engine, result_queue):
                super().__init__(AgentInstance, max_steps, max_length, llm_engine, result_queue)
        '''))
    out, _, _ = run(tok, str(path), ["fine"])
    assert out.reward_score == 2.0


def test_a_step_that_raises_ends_the_episode(tok, tmp_path):
    path = tmp_path / "raising_env.py"
    path.write_text("async def step(states, **kwargs):\n    raise ConnectionError('env server down')\n")
    out, server, _ = run(tok, str(path), ["a", "b"])
    assert len(server.prompts) == 1 and out.extra_fields["env_errors"] == 1 and out.reward_score == 0.0


def test_bad_step_results_name_the_key(tok, tmp_path):
    path = tmp_path / "bad_result_env.py"
    path.write_text("async def step(states, **kwargs):\n    return {'rewards': 1.0, 'done': True}\n")
    with pytest.raises(ValueError, match="no 'environment_feedback'"):
        run(tok, str(path), ["a"])
    path.write_text("async def step(states, **kwargs):\n    return {'rewards': [1, 2], 'done': True, "
                    "'environment_feedback': ''}\n")
    with pytest.raises(ValueError, match="expected one finite number"):
        run(tok, str(path), ["a"])


def test_files_without_the_interface_are_config_errors(tmp_path):
    no_step = tmp_path / "no_step.py"
    no_step.write_text("class AgentInstance:\n    async def reset(self, states):\n        return states\n")
    sync_step = tmp_path / "sync_step.py"
    sync_step.write_text("def reset(states):\n    return states\n\ndef step(states):\n    return {}\n")
    nothing = tmp_path / "nothing.py"
    nothing.write_text("X = 1\n")
    for path, message in ((no_step, "AgentInstance has no step"), (sync_step, "step must be `async def step"),
                          (nothing, "the module has no step"), (tmp_path / "missing.py", "module file not found")):
        with pytest.raises(ValueError, match=message):
            load_openrlhf_agent(str(path))
        loops = tmp_path / f"loops_{path.stem}.yaml"
        loops.write_text(f"- name: env\n  _target_: verl.experimental.agent_loop.OpenRLHFAgentLoop\n"
                         f"  agent_func_path: {path}\n")
        rollout = OmegaConf.create({"mode": "async", "name": "vllm", "agent": {"agent_loop_config_path": str(loops)}})
        with pytest.raises(ConfigError, match=f"agent_loop_config_path=.*: env: .*{message}"):
            check_agent_loop_config(rollout)
    # an adapter chosen as the default loop without a file, an unknown loop name, a bad per-turn cap
    rollout = OmegaConf.create({"mode": "async", "name": "vllm", "agent": {"default_agent_loop": "openrlhf_agent"}})
    with pytest.raises(ConfigError, match="default_agent_loop=openrlhf_agent: agent_func_path is required"):
        check_agent_loop_config(rollout)
    rollout = OmegaConf.create({"mode": "async", "name": "vllm", "agent": {"default_agent_loop": "openrlhf_agnet"}})
    with pytest.raises(ConfigError, match="'openrlhf_agnet' is not a registered agent loop.*openrlhf_agent"):
        check_agent_loop_config(rollout)
    loops = tmp_path / "cap.yaml"
    loops.write_text(f"- name: env\n  _target_: verl.experimental.agent_loop.OpenRLHFAgentLoop\n"
                     f"  agent_func_path: {ENV}\n  max_tokens_per_turn: 0\n")
    rollout = OmegaConf.create({"mode": "async", "name": "vllm", "agent": {"agent_loop_config_path": str(loops)}})
    with pytest.raises(ConfigError, match="max_tokens_per_turn=0"):
        check_agent_loop_config(rollout)


def test_example_files_load_and_run(tok):
    sys.path.insert(0, REPO)
    out, _, _ = run(tok, os.path.join(REPO, "examples/agent_loop/openrlhf_retry_env.py"), ["It is 1.", "56088"])
    assert out.reward_score == 0.5 and out.extra_fields["env_steps"] == 2 and 0 in out.response_mask
    from verl.experimental.agent_loop.openai_agent_loop import load_agent_func

    assert load_agent_func(os.path.join(REPO, "examples/agent_loop/openai_calculator_agent.py")).__name__ == "run_agent"


def test_packed_reward_score_replaces_the_reward_function(tok):
    """The worker packs reward_score into __reward_score__; the reward manager puts it at the last valid token."""
    worker = AgentLoopWorker.__new__(AgentLoopWorker)
    worker.prompt_length, worker.response_length, worker.tokenizer = 8, 6, tok
    outs = [AgentLoopOutput(prompt_ids=[5, 6], response_ids=[7, 8, 9, 10], response_mask=[1, 0, 0, 1],
                            response_logprobs=[-0.1, 0, 0, -0.2], reward_score=0.75, num_turns=3),
            AgentLoopOutput(prompt_ids=[5], response_ids=[7, 8], response_mask=[1, 1], num_turns=2)]
    batch = worker._pack(outs, [0, 0], None, 1, {"pad_token_id": 0})
    assert list(batch.non_tensor_batch["__reward_score__"]) == [0.75, None]
    metrics = agent_loop_metrics(batch)
    assert metrics["agent_loop/masked_tokens/max"] == 2.0 and metrics["agent_loop/masked_tokens/mean"] == 1.0
    assert metrics["agent_loop/agent_reward/mean"] == 0.75
    batch.non_tensor_batch["data_source"] = np.array(["arith", "arith"], dtype=object)
    batch.non_tensor_batch["reward_model"] = np.array([{"ground_truth": "1"}] * 2, dtype=object)
    manager = NaiveRewardManager(tok, 0, compute_score=lambda **kw: -1.0)
    rewards = manager(batch)
    expected = torch.zeros(2, 6)
    expected[0, 3], expected[1, 1] = 0.75, -1.0  # agent reward at row 0's 4th token; the reward fn scores row 1
    assert torch.equal(rewards, expected)
    batch.non_tensor_batch["__reward_score__"] = np.array([0.75, 0.5], dtype=object)
    only_agent = DataProto(batch=batch.batch, non_tensor_batch={"__reward_score__": batch.non_tensor_batch[
        "__reward_score__"]}, meta_info={})
    expected[1, 1] = 0.5  # every row has its own reward: no data_source / ground truth needed
    assert torch.equal(manager(only_agent), expected)
