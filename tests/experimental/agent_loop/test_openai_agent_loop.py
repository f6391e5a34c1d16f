"""openai_agent and the loopback OpenAI endpoint against a scripted engine (the model's turns are fixed strings;
the tokenizer, chat template, HTTP server and OpenAI client are real). Checks the recorded token layout (mask 1
exactly on sampled tokens, the whole sequence equals the chat template of the conversation), tool_calls,
trajectory restarts, the response budget, malformed requests, and the agent function's errors."""

import asyncio
import json
import os

import httpx
import pytest
from omegaconf import OmegaConf

from verl.experimental.agent_loop import OpenAIAgentLoop
from verl.experimental.agent_loop.agent_loop import _TrainerConfig
from verl.experimental.agent_loop.openai_agent_loop import load_agent_func
from verl.experimental.agent_loop.openai_endpoint import ChatSession, get_loopback_server
from verl.utils.embedded.tokenizer import load_tokenizer
from verl.workers.rollout.async_server import TokenOutput

HERE = os.path.dirname(os.path.abspath(__file__))
AGENTS = os.path.join(HERE, "openai_test_agents.py")
QUESTION = [{"role": "user", "content": "What is 123*456?"}]
CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "123*456"}}</tool_call>'


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer()


class ScriptedServer:
    """Answers request k of the episode with script[k] (+ eos); log-prob of the i-th token is -(i+1)/1000."""

    def __init__(self, tok, script, eos=True):
        self.tok, self.script, self.eos, self.prompts = tok, script, eos, []

    async def generate(self, request_id, *, prompt_ids, sampling_params):
        text = self.script[min(len(self.prompts), len(self.script) - 1)]
        self.prompts.append(list(prompt_ids))
        ids = self.tok.encode(text, add_special_tokens=False) + ([self.tok.eos_token_id] if self.eos else [])
        ids = ids[: sampling_params["max_tokens"]]
        return TokenOutput(token_ids=ids, log_probs=[-(i + 1) / 1000 for i in range(len(ids))],
                           finish_reason="stop" if ids[-1] == self.tok.eos_token_id else "length")


def make_loop(tok, server, name, response_length=200, path=AGENTS):
    cfg = OmegaConf.create({"rollout": dict(name="hf", n=1, prompt_length=64, response_length=response_length,
                                            multi_turn={"format": "hermes"}), "model": {"path": "/m/tiny"}})
    return OpenAIAgentLoop(_TrainerConfig(cfg), server, tok, agent_func_path=path, agent_func_name=name)


def run(tok, script, name, response_length=200, eos=True, path=AGENTS, **row):
    server = ScriptedServer(tok, script, eos)
    loop = make_loop(tok, server, name, response_length, path)
    prompt = row.pop("raw_prompt", QUESTION)
    row.setdefault("reward_model", {"ground_truth": "56088"})
    ids = tok.encode(tok.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True))
    out = asyncio.run(loop.run({"temperature": 1.0}, raw_prompt=prompt, raw_prompt_ids=ids, **row))
    return out, server


def assert_layout(out):
    assert len(out.response_ids) == len(out.response_mask) == len(out.response_logprobs)
    assert all(lp == 0.0 for lp, m in zip(out.response_logprobs, out.response_mask) if m == 0)
    assert all(lp < 0 for lp, m in zip(out.response_logprobs, out.response_mask) if m == 1)


@pytest.mark.parametrize("eos", [True, False])
def test_two_turns_are_one_trajectory_with_the_user_turn_masked(tok, eos):
    from tests.experimental.agent_loop.openai_test_agents import RETRY

    out, server = run(tok, ["It is 56088.", "Yes, 56088."], "two_turns", eos=eos)
    assert_layout(out)
    assert out.extra_fields == {"chat_requests": 2, "chat_trajectories": 1, "agent_errors": 0}
    assert out.num_turns == 4 and out.reward_score == 0.25 + 0.5 * (len("Yes, 56088.") % 2)
    first = tok.encode("It is 56088.", add_special_tokens=False) + ([tok.eos_token_id] if eos else [])
    user = tok.encode(("" if eos else "<|im_end|>") + "\n<|im_start|>user\n" + RETRY +
                      "<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
    second = tok.encode("Yes, 56088.", add_special_tokens=False) + ([tok.eos_token_id] if eos else [])
    assert out.prompt_ids == tok.encode(tok.apply_chat_template(QUESTION, tokenize=False, add_generation_prompt=True))
    assert out.response_ids == first + user + second
    assert out.response_mask == [1] * len(first) + [0] * len(user) + [1] * len(second)
    # the second request's prompt is exactly the first turn's tokens plus the inserted user turn
    assert server.prompts[1] == out.prompt_ids + first + user
    if eos:  # the whole sequence is the chat template's rendering of the conversation
        convo = QUESTION + [{"role": "assistant", "content": "It is 56088."}, {"role": "user", "content": RETRY},
                            {"role": "assistant", "content": "Yes, 56088."}]
        assert tok.decode(out.prompt_ids + out.response_ids) == tok.apply_chat_template(convo, tokenize=False).rstrip()


def test_tool_calls_round_trip(tok):
    out, server = run(tok, [CALL, "The answer is 56088."], "with_tool")
    assert_layout(out)
    assert out.reward_score == 1.0 and out.extra_fields["chat_trajectories"] == 1
    first = tok.encode(CALL, add_special_tokens=False) + [tok.eos_token_id]
    tool = tok.encode("\n<|im_start|>tool\n56088<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
    assert out.response_ids[: len(first) + len(tool)] == first + tool
    assert out.response_mask == [1] * len(first) + [0] * len(tool) + [1] * (len(out.response_ids) - len(first)
                                                                            - len(tool))


def test_unrelated_conversation_starts_a_new_trajectory(tok):
    out, _ = run(tok, ["one", "two"], "restart")
    assert out.extra_fields["chat_trajectories"] == 2 and out.reward_score is None
    assert tok.decode(out.prompt_ids).endswith("second<|im_end|>\n<|im_start|>assistant\n")
    assert out.response_ids == tok.encode("two", add_special_tokens=False) + [tok.eos_token_id]


def test_budget_refusal_ends_the_episode_normally(tok):
    out, server = run(tok, ["ok"], "until_refused", response_length=120)
    assert_layout(out)
    assert out.extra_fields["agent_errors"] == 0 and len(server.prompts) == 3
    assert len(out.response_ids) < 120 and out.response_mask[-1] == 1


def test_agent_exception_keeps_the_recorded_turn(tok):
    out, _ = run(tok, ["hello"], "raises")
    assert out.extra_fields["agent_errors"] == 1 and out.reward_score is None
    assert out.response_mask == [1] * len(out.response_ids) and out.response_ids


def test_completions_route(tok):
    out, server = run(tok, [" 4", " 6"], "completions", eos=False)
    assert_layout(out)
    assert out.prompt_ids == tok.encode("Q: 2+2?\nA:", add_special_tokens=False)
    inserted = tok.encode("\nQ: 3+3?\nA:", add_special_tokens=False)
    four, six = tok.encode(" 4", add_special_tokens=False), tok.encode(" 6", add_special_tokens=False)
    assert out.response_ids == four + inserted + six
    assert out.response_mask == [1] * len(four) + [0] * len(inserted) + [1] * len(six)


def test_malformed_requests_get_clear_400s(tok):
    endpoint = get_loopback_server()

    async def go():
        session = ChatSession(tok, ScriptedServer(tok, ["x"]), {}, 64, 100)
        base = endpoint.open(session)
        cases = [
            ("chat/completions", b"{not json", 400, "not valid JSON"),
            ("chat/completions", b"[1, 2]", 400, "must be a JSON object"),
            ("chat/completions", json.dumps({"model": "m"}).encode(), 400, "'messages' must be a non-empty list"),
            ("chat/completions", json.dumps({"messages": [{"role": "robot", "content": "x"}]}).encode(), 400,
             "messages[0].role='robot'"),
            ("chat/completions", json.dumps({"messages": QUESTION, "stream": True}).encode(), 400, "stream=true"),
            ("chat/completions", json.dumps({"messages": QUESTION, "n": 2}).encode(), 400, "n=2"),
            ("chat/completions", json.dumps({"messages": QUESTION, "max_tokens": 0}).encode(), 400, "max_tokens=0"),
            ("chat/completions", json.dumps({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})
             .encode(), 400, "only text parts"),
            ("completions", json.dumps({"prompt": ""}).encode(), 400, "'prompt' must be a non-empty string"),
            ("completions", json.dumps({"prompt": "x", "echo": True}).encode(), 400, "echo=true"),
        ]
        async with httpx.AsyncClient(trust_env=False) as http:
            for route, body, status, message in cases:
                r = await http.post(f"{base}/{route}", content=body, headers={"content-type": "application/json"})
                assert r.status_code == status, (route, body, r.text)
                assert message in r.json()["error"]["message"], (message, r.json())
            r = await http.post(base.replace(session.session_id, "nope") + "/chat/completions",
                                json={"messages": QUESTION})
            assert r.status_code == 404 and "unknown session" in r.json()["error"]["message"]
            models = (await http.get(f"{base}/models")).json()
            assert models["data"][0]["id"] == "policy"
        endpoint.close(session)
        assert session.trajectory is None  # nothing was recorded from refused requests

    asyncio.run(go())


def test_agent_function_errors_name_the_problem(tmp_path):
    with pytest.raises(ValueError, match="agent_func_path is required"):
        load_agent_func(None)
    with pytest.raises(ValueError, match="defines no 'missing'"):
        load_agent_func(AGENTS, "missing")
    with pytest.raises(ValueError, match="must be an async function"):
        load_agent_func(AGENTS, "not_async")
    with pytest.raises(ValueError, match="module file not found"):
        load_agent_func(str(tmp_path / "nope.py"))


def test_the_example_agent_runs_its_tool_and_scores(tok):
    example = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(HERE))),
                           "examples/agent_loop/openai_calculator_agent.py")
    out, server = run(tok, [CALL, "The answer is 56088."], "run_agent", path=example)
    assert out.reward_score == 1.0 and out.extra_fields == {"chat_requests": 2, "chat_trajectories": 1,
                                                            "agent_errors": 0}
    tool = tok.encode("\n<|im_start|>tool\n56088<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
    masked = [t for t, m in zip(out.response_ids, out.response_mask) if m == 0]
    assert masked == tool  # the calculator's result, computed by the example's own tool code
