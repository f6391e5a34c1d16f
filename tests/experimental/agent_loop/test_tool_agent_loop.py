"""ToolAgentLoop against a scripted engine (pure logic: the model's turns are fixed strings, the tokenizer, chat
template, tools and packing are real). Checks the token layout (mask 0 exactly on tool tokens, the whole
sequence equals the chat template of the conversation), the turn limits, and every kind of bad input."""

import asyncio
import os
import textwrap
import time

import pytest
import torch
from omegaconf import OmegaConf

from verl.experimental.agent_loop import AgentLoopWorker, ToolAgentLoop
from verl.experimental.agent_loop.agent_loop import AsyncLLMServerManager, _TrainerConfig
from verl.protocol import DataProto
from verl.utils.embedded.tokenizer import load_tokenizer
from verl.workers.rollout.async_server import TokenOutput

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer()


def tool_config(tmp_path, extra=""):
    path = tmp_path / "tools.yaml"
    path.write_text(textwrap.dedent("""
        tools:
          - class_name: verl.tools.calculator_tool.CalculatorTool
            config: {type: native, timeout: 5}
          - class_name: tests.tools.fault_tools.RaisingTool
            config: {type: native}
          - class_name: tests.tools.fault_tools.HangingTool
            config: {type: native, timeout: 0.3}
          - class_name: tests.tools.fault_tools.FloodTool
            config: {type: native}
        """) + extra)
    return str(path)


def arr_config(tool_path, response_length=400, **mt):
    multi_turn = dict(enable=True, tool_config_path=tool_path, max_assistant_turns=None, max_user_turns=None,
                      max_parallel_calls=1, max_tool_response_length=64, tool_response_truncate_side="middle",
                      format="hermes")
    multi_turn.update(mt)
    return OmegaConf.create({"rollout": dict(name="hf", n=1, temperature=1.0, top_p=1.0, top_k=-1, do_sample=True,
                                             prompt_length=64, response_length=response_length,
                                             multi_turn=multi_turn,
                                             agent=dict(default_agent_loop="tool_agent"))})


class ScriptedServer:
    """Answers turn k of every episode with script[k] (text + the eos token); log-prob of token t is -t/1000."""

    def __init__(self, tok, script):
        self.tok, self.script, self.turn = tok, script, {}
        self.prompts = []

    async def generate(self, request_id, *, prompt_ids, sampling_params):
        k = self.turn.get(request_id, 0)
        self.turn[request_id] = k + 1
        self.prompts.append(list(prompt_ids))
        ids = self.tok.encode(self.script[min(k, len(self.script) - 1)], add_special_tokens=False)
        ids = ids + [self.tok.eos_token_id]
        ids = ids[: sampling_params["max_tokens"]]
        reason = "stop" if ids[-1] == self.tok.eos_token_id else "length"
        return TokenOutput(token_ids=ids, log_probs=[-(i + 1) / 1000 for i in range(len(ids))], finish_reason=reason)


def run_episode(tok, cfg, script, messages=None, **row):
    server = ScriptedServer(tok, script)
    loop = ToolAgentLoop(_TrainerConfig(cfg), server, tok)
    messages = messages or [{"role": "user", "content": "What is 123*456?"}]
    out = asyncio.run(loop.run({"temperature": 1.0}, raw_prompt=messages, raw_prompt_ids=[], **row))
    return out, server


CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "123*456"}}</tool_call>'


def test_tool_tokens_have_mask_zero_and_sequence_is_the_chat_template(tok, tmp_path):
    cfg = arr_config(tool_config(tmp_path))
    out, server = run_episode(tok, cfg, [CALL, "The answer is 56088."])
    assert out.num_turns == 4 and out.extra_fields["tool_calls"] == 1 and out.extra_fields["tool_errors"] == 0
    assert len(out.response_ids) == len(out.response_mask) == len(out.response_logprobs)
    # the whole token sequence is exactly the template rendering of the conversation
    convo = [{"role": "user", "content": "What is 123*456?"}, {"role": "assistant", "content": CALL},
             {"role": "tool", "content": "56088"}, {"role": "assistant", "content": "The answer is 56088."}]
    expected = tok.apply_chat_template(convo, tokenize=False)
    assert tok.decode(out.prompt_ids + out.response_ids) == expected.rstrip("\n")
    # mask: the two model turns are 1, the tool turn in between is 0
    first = len(tok.encode(CALL)) + 1
    tool_part = tok.encode("\n<|im_start|>tool\n56088<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
    assert out.response_mask[:first] == [1] * first
    assert out.response_mask[first:first + len(tool_part)] == [0] * len(tool_part)
    assert out.response_ids[first:first + len(tool_part)] == tool_part
    assert all(m == 1 for m in out.response_mask[first + len(tool_part):])
    assert all(lp == 0.0 for lp, m in zip(out.response_logprobs, out.response_mask) if m == 0)
    assert all(lp < 0 for lp, m in zip(out.response_logprobs, out.response_mask) if m == 1)
    # the second request carried the first turn and the tool result as its prompt
    assert server.prompts[1] == out.prompt_ids + out.response_ids[:first + len(tool_part)]


@pytest.mark.parametrize("call, message", [
    ('<tool_call>{"name": "calculator", "arguments": {"expression": </tool_call>', "not valid JSON"),
    ('<tool_call>{"name": "nope", "arguments": {}}</tool_call>', "unknown tool 'nope'"),
    ('<tool_call>{"name": "boom", "arguments": {}}</tool_call>', "failed: RuntimeError: the tool broke"),
    ('<tool_call>{"name": "hang", "arguments": {}}</tool_call>', "did not finish within 0.3 s"),
    ('<tool_call>{"name": "calculator", "arguments": {"expression": "__import__(1)"}}</tool_call>', "'__import__(1)' is not"),
    ('<tool_call>{"name": "calculator", "arguments": {"expression": "1"}', "never closed"),
])
def test_bad_calls_become_error_messages_and_the_episode_continues(tok, tmp_path, call, message):
    cfg = arr_config(tool_config(tmp_path))
    start = time.perf_counter()
    out, _ = run_episode(tok, cfg, [call, "done"])
    assert time.perf_counter() - start < 5
    tool_text = tok.decode([t for t, m in zip(out.response_ids, out.response_mask) if m == 0])
    assert "Error:" in tool_text and message in tool_text
    assert out.extra_fields["tool_errors"] == 1 and out.num_turns == 4
    assert tok.decode(out.response_ids).endswith("done<|im_end|>")  # the model got its next turn


def test_huge_tool_output_is_cut(tok, tmp_path):
    cfg = arr_config(tool_config(tmp_path), max_tool_response_length=40)
    out, _ = run_episode(tok, cfg, ['<tool_call>{"name": "flood", "arguments": {}}</tool_call>', "ok"])
    tool_text = tok.decode([t for t, m in zip(out.response_ids, out.response_mask) if m == 0])
    body = tool_text.split("tool\n", 1)[1].split("<|im_end|>")[0]
    assert body == "A" * 20 + "...(truncated)..." + "A" * 17 + "END"  # 40 characters kept: head and tail


def test_turn_limits_and_parallel_calls(tok, tmp_path):
    path = tool_config(tmp_path)
    out, server = run_episode(tok, arr_config(path, max_assistant_turns=2), [CALL])
    assert out.num_turns == 4 and len(server.prompts) == 2  # model, tool, model: stops at 2 assistant turns
    out, server = run_episode(tok, arr_config(path, max_user_turns=1), [CALL])
    assert len(server.prompts) == 1 and out.response_mask[-1] == 0 and out.num_turns == 3  # ends after the tool turn
    two = CALL + CALL.replace("123*456", "2+2")
    out, _ = run_episode(tok, arr_config(path, max_parallel_calls=1), [two, "ok"])
    text = tok.decode([t for t, m in zip(out.response_ids, out.response_mask) if m == 0])
    assert "56088" in text and "at most 1 tool call" in text and out.extra_fields["tool_errors"] == 1
    out, _ = run_episode(tok, arr_config(path, max_parallel_calls=2), [two, "ok"])
    text = tok.decode([t for t, m in zip(out.response_ids, out.response_mask) if m == 0])
    assert "56088" in text and "\n4<|im_end|>" in text and out.extra_fields["tool_errors"] == 0


def test_response_budget_is_never_exceeded(tok, tmp_path):
    cfg = arr_config(tool_config(tmp_path), response_length=120)
    out, _ = run_episode(tok, cfg, [CALL] * 10)
    assert 0 < len(out.response_ids) <= 120


def test_ground_truth_from_tools_kwargs_reaches_the_tool(tok, tmp_path):
    cfg = arr_config(tool_config(tmp_path))
    out, _ = run_episode(tok, cfg, [CALL, "56088"],
                         tools_kwargs={"calculator": {"create_kwargs": {"ground_truth": 56088}}})
    assert out.extra_fields["tool_rewards"] == 2.0  # step reward 1 + calc_reward 1
    out, _ = run_episode(tok, cfg, [CALL, "56088"],
                         tools_kwargs={"calculator": {"create_kwargs": {"ground_truth": 7}}})
    assert out.extra_fields["tool_rewards"] == 0.0


def test_worker_packs_episodes_concurrently_with_unknown_agent_name(tok, tmp_path):
    cfg = arr_config(tool_config(tmp_path))

    class Engine:
        """generate_requests for the AsyncRolloutServer: every request answers with the calculator call once,
        then 'ok' (the turn is read from the prompt: a tool turn present -> answer)."""
        config = None
        calls = []

        def generate_requests(self, requests):
            self.calls.append(len(requests))
            outs = []
            for r in requests:
                text = "ok" if tok.decode(r.prompt_ids).count("<|im_start|>tool") else CALL
                ids = tok.encode(text, add_special_tokens=False) + [tok.eos_token_id]
                outs.append(TokenOutput(ids, [-0.5] * len(ids), "stop"))
            return outs

    worker = AgentLoopWorker(cfg, Engine(), tok)
    import numpy as np
    prompts_text = ["<|im_start|>user\nq1<|im_end|>\n<|im_start|>assistant\n"] * 3
    ids = [tok.encode(t, add_special_tokens=False) for t in prompts_text]
    width = 64
    input_ids = torch.tensor([[tok.pad_token_id] * (width - len(i)) + i for i in ids])
    attn = (input_ids != tok.pad_token_id).long()
    raw = np.empty(3, dtype=object)
    for i in range(3):
        raw[i] = [{"role": "user", "content": "q1"}]
    names = np.array(["tool_agent", "single_turn_agent", "no_such_agent"], dtype=object)
    data = DataProto.from_dict({"input_ids": input_ids, "attention_mask": attn,
                                "position_ids": torch.clamp(attn.cumsum(-1) - 1, min=0)},
                               non_tensors={"raw_prompt": raw, "agent_name": names},
                               meta_info={"eos_token_id": tok.eos_token_id, "pad_token_id": tok.pad_token_id})
    out = worker.generate_sequences(data)
    assert out.batch["responses"].shape == (3, 400) and out.batch["prompts"].shape == (3, 64)
    assert list(out.non_tensor_batch["__num_turns__"]) == [4, 2, 4]  # the unknown name ran the default tool_agent
    assert list(out.non_tensor_batch["__unknown_agent__"]) == [0, 0, 1]
    assert list(out.non_tensor_batch["__tool_calls__"]) == [1, 0, 1]
    assert set(out.non_tensor_batch) == {"__num_turns__", "__tool_calls__", "__tool_errors__", "__tool_rewards__",
                                         "__turn_scores__", "__unknown_agent__", "__generate_s__", "__tool_s__",
                                         "__extra_fields__", "__reward_score__"}  # the same columns whichever loops ran
    assert list(out.non_tensor_batch["__reward_score__"]) == [None] * 3  # tool_agent leaves scoring to the reward fn
    assert Engine.calls[0] == 3  # the first turns of all three episodes went to the engine together
    rm = out.batch["response_mask"]
    attn_resp = out.batch["attention_mask"][:, 64:]
    assert bool((rm <= attn_resp).all()) and int((attn_resp - rm).sum()) > 0  # tool tokens: attended, not trained
    assert bool((out.batch["rollout_log_probs"][rm == 0] == 0).all())


def test_interaction_replies_as_a_user_turn_until_correct(tok, tmp_path):
    ipath = tmp_path / "interaction.yaml"
    ipath.write_text("interaction:\n  - name: checker\n"
                     "    class_name: verl.interactions.answer_check_interaction.AnswerCheckInteraction\n"
                     "    config: {max_attempts: 3}\n")
    cfg = arr_config(tool_config(tmp_path), interaction_config_path=str(ipath))
    out, server = run_episode(tok, cfg, ["It is 7.", "It is 56088."],
                              interaction_kwargs={"name": "checker", "ground_truth": "56088"})
    assert len(server.prompts) == 2 and out.extra_fields["turn_scores"] == [0.0, 1.0]
    user_text = tok.decode([t for t, m in zip(out.response_ids, out.response_mask) if m == 0])
    assert user_text == "\n<|im_start|>user\nThat is not right. Try again.<|im_end|>\n<|im_start|>assistant\n"
    assert out.num_turns == 4  # prompt, wrong answer, user reply, right answer
    # no interaction_kwargs: the first answer ends the episode
    out, server = run_episode(tok, cfg, ["It is 7."])
    assert len(server.prompts) == 1 and out.extra_fields["turn_scores"] == []


def test_qwen_tool_call_format_is_hermes_syntax(tok):
    # verl's search-R1 example config sets multi_turn.format=qwen (SGLang's parser name for Qwen2.5's syntax)
    from verl.experimental.agent_loop.tool_parser import HermesToolParser, ToolParser

    parser = ToolParser.get_tool_parser("qwen", tok)
    assert isinstance(parser, HermesToolParser)
    rest, calls, errors = parser.parse('Let me look. <tool_call>{"name": "search", "arguments": {"query": "x"}}'
                                       '</tool_call>')
    assert rest == "Let me look." and [c.name for c in calls] == ["search"] and errors == []


def test_gsm8k_interaction_grades_the_latest_answer_strictly(tok, tmp_path):
    from verl.interactions.gsm8k_interaction import WRONG

    ipath = tmp_path / "gsm8k_interaction.yaml"
    ipath.write_text("interaction:\n  - name: gsm8k\n"
                     "    class_name: verl.interactions.gsm8k_interaction.Gsm8kInteraction\n    config: {}\n")
    cfg = arr_config(tool_config(tmp_path), interaction_config_path=str(ipath))
    # "56088" without the #### marker is wrong for the strict scorer; the second answer is right
    out, server = run_episode(tok, cfg, ["It is 56088.", "So #### 56088"],
                              interaction_kwargs={"name": "gsm8k", "ground_truth": "56088"})
    assert len(server.prompts) == 2 and out.extra_fields["turn_scores"] == [0.0, 1.0]
    user_text = tok.decode([t for t, m in zip(out.response_ids, out.response_mask) if m == 0])
    assert WRONG in user_text
