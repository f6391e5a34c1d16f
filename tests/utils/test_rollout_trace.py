"""Rollout tracing (verl.utils.rollout_trace, ``actor_rollout_ref.rollout.trace.*``) with the mlflow backend writing
to a local SQLite store in a temp dir, read back with MLflow's own client: span names, inputs and outputs, the
episode tags, token2text, the per-step sample cap, trace=False; the agent-loop worker (scripted engine, real
tokenizer, tool_agent with the calculator tool) tracing its episodes; backend None recording nothing; weave and a
missing mlflow refused by name before any worker starts."""

import asyncio
import shutil
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

import verl.utils.rollout_trace as rt
from tests.trainer.validator_assets import write_validator_assets
from verl.utils.config import ConfigError
from verl.utils.rollout_trace import RolloutTraceConfig, rollout_trace_attr, rollout_trace_op, traced_samples
from verl.workers.rollout.async_server import TokenOutput

mlflow = pytest.importorskip("mlflow")

REPO = Path(__file__).resolve().parents[2]
CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "12*34"}}</tool_call>'


@pytest.fixture(scope="module")
def tok():
    from verl.utils.embedded.tokenizer import load_tokenizer

    return load_tokenizer()


@pytest.fixture(scope="module")
def empty_db(tmp_path_factory):
    """A SQLite store with MLflow's tables (creating them takes seconds: once per module, then copied)."""
    path = tmp_path_factory.mktemp("mlflow_template") / "mlflow.db"
    mlflow.MlflowClient(f"sqlite:///{path}").search_experiments()
    return path


@pytest.fixture
def store(tmp_path, monkeypatch, empty_db):
    """cwd = a temp dir holding an empty ./mlflow.db, the default store (no MLFLOW_TRACKING_URI)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    shutil.copy(empty_db, tmp_path / "mlflow.db")
    yield f"sqlite:///{tmp_path / 'mlflow.db'}"
    RolloutTraceConfig.reset()


def traces(uri, project="proj"):
    client = mlflow.MlflowClient(uri)
    experiment = client.get_experiment_by_name(project)
    if experiment is None:
        return []
    return client.search_traces(locations=[experiment.experiment_id])


def spans_by_name(trace):
    out = {}
    for span in trace.data.spans:
        out.setdefault(span.name, []).append(span)
    return out


class Agent:
    """A stand-in agent loop: two model turns through a decorated generate."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    @rollout_trace_op
    async def generate(self, request_id, *, prompt_ids, sampling_params):
        ids = self.tokenizer.encode(" 408", add_special_tokens=False)
        return TokenOutput(token_ids=ids, log_probs=[-0.5] * len(ids), finish_reason="stop")

    @rollout_trace_op
    async def run(self, sampling_params, **kwargs):
        from verl.experimental.agent_loop import AgentLoopOutput

        prompt = self.tokenizer.encode("12*34=", add_special_tokens=False)
        first = await self.generate("r", prompt_ids=prompt, sampling_params=sampling_params)
        second = await self.generate("r", prompt_ids=prompt + first.token_ids, sampling_params=sampling_params)
        response = first.token_ids + second.token_ids
        return AgentLoopOutput(prompt_ids=prompt, response_ids=response, response_mask=[1] * len(response))

    @rollout_trace_op
    def score(self, text, bonus=0.5):
        return {"score": len(text) + bonus}


async def episode(agent, **attrs):
    with rollout_trace_attr(name="agent_loop", **attrs):
        out = await agent.run({"temperature": 1.0}, index=np.int64(7), raw_prompt=np.array([{"role": "user"}]))
        agent.score("ab")
        return out


def test_backend_none_records_nothing_and_skips_the_recording_code(tok, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    RolloutTraceConfig.init("proj", "exp", None, token2text=True, max_samples_per_step_per_worker=1)
    monkeypatch.setattr(rt, "_span", lambda *a, **k: pytest.fail("backend None must not open a span"))
    monkeypatch.setattr(rt, "_plain", lambda *a, **k: pytest.fail("backend None must not convert arguments"))
    out = asyncio.run(episode(Agent(tok), step=1, sample_index=7, rollout_n=0))
    assert len(out.response_ids) > 0
    assert RolloutTraceConfig.get_client() is None and traced_samples(range(5), step=1) is None
    assert list(tmp_path.iterdir()) == []  # no store was opened
    RolloutTraceConfig.reset()


def test_mlflow_trace_spans_inputs_outputs_tags_and_token2text(tok, store):
    RolloutTraceConfig.init("proj", "exp", "mlflow", token2text=True)
    out = asyncio.run(episode(Agent(tok), step=3, sample_index=7, rollout_n=1, validate=True))
    RolloutTraceConfig.flush()
    (trace,) = traces(store)
    tags = trace.info.tags
    assert {k: tags[k] for k in ("step", "sample_index", "rollout_n", "validate", "experiment_name")} == {
        "step": "3", "sample_index": "7", "rollout_n": "1", "validate": "True", "experiment_name": "exp"}
    spans = spans_by_name(trace)
    assert sorted(spans) == ["Agent.generate", "Agent.run", "Agent.score", "agent_loop"]
    root, run = spans["agent_loop"][0], spans["Agent.run"][0]
    assert root.parent_id is None and run.parent_id == root.span_id
    assert len(spans["Agent.generate"]) == 2 and all(s.parent_id == run.span_id for s in spans["Agent.generate"])
    # inputs: the arguments (self left out, numpy values as Python values); outputs: the return value + its text
    assert run.inputs == {"sampling_params": {"temperature": 1.0},
                          "kwargs": {"index": 7, "raw_prompt": [{"role": "user"}]}}
    answer = tok.encode(" 408", add_special_tokens=False)
    gen = max(spans["Agent.generate"], key=lambda s: s.start_time_ns)  # the second turn
    assert gen.inputs["request_id"] == "r" and gen.inputs["prompt_ids"] == out.prompt_ids + answer
    assert gen.outputs["token_ids"] == answer
    assert gen.outputs["text"] == " 408" and gen.outputs["finish_reason"] == "stop"
    assert run.outputs["response_ids"] == out.response_ids and run.outputs["response_text"] == " 408 408"
    assert run.outputs["prompt_text"] == "12*34="
    score = spans["Agent.score"][0]  # a plain (not async) method
    assert score.inputs == {"text": "ab", "bonus": 0.5} and score.outputs == {"score": 2.5}


def test_token2text_off_records_ids_only_and_trace_false_records_nothing(tok, store):
    RolloutTraceConfig.init("proj", "exp", "mlflow", token2text=False)
    asyncio.run(episode(Agent(tok), step=1, sample_index=0, rollout_n=0))
    asyncio.run(episode(Agent(tok), step=1, sample_index=1, rollout_n=0, trace=False))
    RolloutTraceConfig.flush()
    (trace,) = traces(store)
    assert trace.info.tags["sample_index"] == "0"
    run = spans_by_name(trace)["Agent.run"][0]
    assert "response_ids" in run.outputs and "response_text" not in run.outputs
    assert "text" not in spans_by_name(trace)["Agent.generate"][0].outputs


def test_sample_cap_picks_distinct_samples_per_step(store):
    RolloutTraceConfig.init("proj", "exp", "mlflow", max_samples_per_step_per_worker=2)
    ids = [10, 10, 11, 12, 13, 14]  # 10 twice: one sample, two rows
    picked = traced_samples(ids, step=4)
    assert len(picked) == 2 and picked <= set(ids)
    assert traced_samples(ids, step=4) == picked  # seeded by the step, not the global random state
    assert any(traced_samples(ids, step=s) != picked for s in range(5, 15))
    assert traced_samples([1, 2], step=4) == {1, 2}
    RolloutTraceConfig.init("proj", "exp", "mlflow", max_samples_per_step_per_worker=0)
    assert traced_samples(ids, step=4) == set()
    RolloutTraceConfig.init("proj", "exp", "mlflow", max_samples_per_step_per_worker=None)
    assert traced_samples(ids, step=4) is None
    with pytest.raises(ValueError, match="max_samples_per_step_per_worker=-1"):
        RolloutTraceConfig.init("proj", "exp", "mlflow", max_samples_per_step_per_worker=-1)


def test_agent_loop_worker_traces_capped_episodes_into_the_loggers_experiment(tok, store, tmp_path):
    from verl.experimental.agent_loop import AgentLoopWorker
    from verl.protocol import DataProto
    from verl.utils.tracking import Tracking

    tracker = Tracking("proj", "exp", default_backend=["mlflow"])  # trainer.logger=mlflow: its run, same store
    tools = tmp_path / "tools.yaml"
    tools.write_text(textwrap.dedent("""
        tools:
          - class_name: verl.tools.calculator_tool.CalculatorTool
            config: {type: native, timeout: 5}
        """))
    cfg = OmegaConf.create({"rollout": dict(
        name="hf", n=2, temperature=1.0, prompt_length=64, response_length=200,
        multi_turn=dict(enable=True, tool_config_path=str(tools), max_assistant_turns=3),
        agent=dict(default_agent_loop="tool_agent"),
        trace=dict(backend="mlflow", token2text=True, max_samples_per_step_per_worker=2))})

    class Engine:
        """Every episode: the calculator call, then (a tool turn in the prompt) the answer."""
        config = None

        def generate_requests(self, requests):
            outs = []
            for r in requests:
                text = "408" if "<|im_start|>tool" in tok.decode(r.prompt_ids) else CALL
                ids = tok.encode(text, add_special_tokens=False) + [tok.eos_token_id]
                outs.append(TokenOutput(ids, [-0.5] * len(ids), "stop"))
            return outs

    worker = AgentLoopWorker(cfg, Engine(), tok, run_names=("proj", "exp"))
    prompt = tok.encode("<|im_start|>user\n12*34?<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)

    def batch(index, **meta):
        input_ids = torch.tensor([[tok.pad_token_id] * (64 - len(prompt)) + prompt] * len(index))
        attn = (input_ids != tok.pad_token_id).long()
        raw = np.empty(len(index), dtype=object)
        for i in range(len(index)):
            raw[i] = [{"role": "user", "content": "12*34?"}]
        return DataProto.from_dict({"input_ids": input_ids, "attention_mask": attn,
                                    "position_ids": torch.clamp(attn.cumsum(-1) - 1, min=0)},
                                   non_tensors={"raw_prompt": raw, "index": np.array(index, dtype=object)},
                                   meta_info=dict(meta, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id))

    out = worker.generate_sequences(batch([100, 101, 102], global_steps=5))  # starts writing the step's traces
    assert list(out.non_tensor_batch["__tool_calls__"]) == [1] * 6
    RolloutTraceConfig.flush()  # waits for that

    found = traces(store)
    assert len(found) == 4  # 2 of the 3 samples x rollout.n=2
    samples = {(t.info.tags["sample_index"], t.info.tags["rollout_n"]) for t in found}
    assert len({s for s, _ in samples}) == 2 and {n for _, n in samples} == {"0", "1"} and len(samples) == 4
    assert all(t.info.tags["step"] == "5" and t.info.tags["validate"] == "False" for t in found)
    spans = spans_by_name(found[0])
    assert len(spans["agent_loop"]) == 1 and len(spans["ToolAgentLoop.run"]) == 1
    assert len(spans["AsyncLLMServerManager.generate"]) == 2
    (tool,) = spans["ToolAgentLoop._call_tool"]
    assert tool.inputs["call"]["name"] == "calculator" and tool.outputs[:2] == ["408", False]
    first_turn = min(spans["AsyncLLMServerManager.generate"], key=lambda s: s.start_time_ns)
    assert first_turn.outputs["text"].startswith("<tool_call>")  # token2text on the server manager's output
    run = spans["ToolAgentLoop.run"][0]
    assert "<|im_start|>tool" in run.outputs["response_text"] and "12*34?" in run.outputs["prompt_text"]

    # validation (n=1, a sample's rollouts as repeated rows): numbered per sample, tagged validate
    worker.generate_sequences(batch([200, 200], global_steps=6, validate=True))
    RolloutTraceConfig.flush()
    found = [t for t in traces(store) if t.info.tags["validate"] == "True"]
    assert sorted((t.info.tags["sample_index"], t.info.tags["rollout_n"]) for t in found) == [("200", "0"),
                                                                                              ("200", "1")]

    # the traces are in the experiment of the logger's run (trainer.project_name), in the default ./mlflow.db
    run_info = tracker.logger["mlflow"].run.info
    tracker.finish()
    assert found[0].info.experiment_id == run_info.experiment_id
    assert store == f"sqlite:///{Path.cwd() / 'mlflow.db'}"


def test_run_names_come_from_the_whole_config():
    cfg = OmegaConf.create({"trainer": {"project_name": "p", "experiment_name": "e"}, "actor_rollout_ref": {"x": 1}})
    import pickle

    assert rt.trainer_run_names(pickle.loads(pickle.dumps(cfg.actor_rollout_ref))) == ("p", "e")  # as Ray sends it
    assert rt.trainer_run_names(OmegaConf.create({"x": 1})) == ("verl_examples", "gsm8k")


# ------------------------------------------------------------------------------- refused before the workers start
@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    return write_validator_assets(tmp_path_factory.mktemp("assets"))


def validate(assets, *extra):
    from verl.trainer.config_schema.validate import validate_ppo_config

    with initialize_config_dir(config_dir=str(REPO / "verl/trainer/config"), version_base=None):
        cfg = compose(config_name="ppo_trainer", overrides=[
            f"data.train_files={assets / 'train.parquet'}", f"data.val_files={assets / 'train.parquet'}",
            f"actor_rollout_ref.model.path={assets / 'model'}", "actor_rollout_ref.rollout.name=hf",
            "data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2", "algorithm.adv_estimator=grpo",
            "actor_rollout_ref.rollout.n=2", "trainer.n_gpus_per_node=2", "trainer.logger=console", *extra])
    validate_ppo_config(cfg)


TRACE = "actor_rollout_ref.rollout.trace"


def test_config_accepts_mlflow_and_refuses_weave_sync_and_a_missing_package(assets, monkeypatch):
    validate(assets, f"{TRACE}.backend=mlflow", f"{TRACE}.token2text=True",
             f"{TRACE}.max_samples_per_step_per_worker=4", "trainer.logger=[console,mlflow]")
    with pytest.raises(ConfigError, match=rf"{TRACE}.backend='weave' is not supported: weave records traces in the "
                                          r"W&B Weave service"):
        validate(assets, f"{TRACE}.backend=weave")
    with pytest.raises(ConfigError, match=rf"{TRACE}.backend=mlflow is set but actor_rollout_ref.rollout.mode=sync"):
        validate(assets, f"{TRACE}.backend=mlflow", "actor_rollout_ref.rollout.mode=sync")
    monkeypatch.setattr(rt, "missing_mlflow_packages", lambda uri=None: ["mlflow-skinny"])
    with pytest.raises(ConfigError, match=rf"{TRACE}.backend=mlflow needs mlflow-skinny, not installed here: "
                                          r"pip install mlflow-skinny"):
        validate(assets, f"{TRACE}.backend=mlflow")
    with pytest.raises(ValueError, match="W&B Weave service"):
        RolloutTraceConfig.init("proj", "exp", "weave")  # a worker built by hand is refused the same way
