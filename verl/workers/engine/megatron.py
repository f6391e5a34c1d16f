"""The Megatron training engine: a megatron-core ``GPTModel`` with tensor, sequence and pipeline parallelism.

``MegatronEngine.build(EngineConfig, ...)`` (``strategy=megatron``) reads ``<role>.megatron.*``:
``tensor_model_parallel_size``, ``pipeline_model_parallel_size``, ``virtual_pipeline_model_parallel_size``,
``sequence_parallel`` (forced off at TP=1), ``use_distributed_optimizer``, ``seed``, ``dtype``,
``use_dist_checkpointing`` / ``dist_checkpointing_path`` / ``dist_checkpointing_prefix`` (initial weights from a
Megatron distributed checkpoint instead of ``model.path``'s HF weights: :mod:`verl.models.mcore.dist_ckpt`); the
offload keys are no-ops on CPU (the weights already live
in host memory). Keys megatron-core cannot honour here (context parallelism; expert parallelism for a dense
model) are refused naming the key.

Mixture-of-experts models (Qwen3-MoE, Qwen2-MoE, DeepSeek-V3 / Moonlight with multi-latent attention: see
``verl.models.mcore.experts`` and ``verl.models.mcore.deepseek_v3``): megatron-core's MoE layer
with ``expert_model_parallel_size`` (EP) expert groups, each expert cut over ``expert_tensor_parallel_size`` ranks
(default: the TP size); tokens reach their experts by all-to-all (or all-gather, ``moe_token_dispatcher_type``).
Expert gradients are averaged over the ranks holding the same experts (megatron's expert data-parallel group),
the gradient norm adds the experts over the expert-parallel ranks; with EP > 1 the optimizer state is not sharded
(ZeRO's broadcast would overwrite the experts other data-parallel ranks hold). Their weights go to the rollout as
full per-expert HF tensors (``mlp.experts.<e>.*_proj.weight``).

Router replay (``actor.router_replay.mode=R2``; :mod:`verl.models.mcore.router_replay`): the routers are built with
megatron's ``RouterReplay``; ``infer`` with the output ``routed_experts`` records every token's top-k experts per MoE
layer (by row and column of ``input_ids``, gathered over tensor and pipeline ranks), and a micro-batch that carries
``routed_experts`` (the update's batch key, or ``infer(carry=...)``) runs with exactly those experts, in its forward
and in the recomputation of its layers during backward.

LoRA (``model.lora.rank > 0``, verl's Megatron keys; :mod:`verl.models.mcore.lora`): adapters on the
tensor-parallel linear layers, the base frozen and only the adapters in the optimizer; :meth:`disable_adapter` runs
the base model (the reference policy); the weight export merges ``W + alpha / rank * B @ A`` per rank's piece.

How a micro-batch runs: each row is shifted so its valid tokens start at column 0 (left-padded prompts and
right-padded responses are contiguous), which makes rotary positions equal the HF ``position_ids`` and the
causal mask sufficient; columns are trimmed to the longest row (a multiple of the TP size with sequence
parallel). Log-probs and entropies come from the vocabulary-parallel logits
(``verl.utils.megatron.vocab_parallel``); with ``model.use_fused_kernels`` the model returns its last hidden
states and the logits are formed a chunk of tokens at a time (recomputed in backward), so the full
``[tokens, vocabulary / TP]`` logits never exist. The critic's values come from a replicated scalar head.

Pipeline parallel: each micro-batch goes forward stage by stage (activations sent point-to-point to the next
stage), the last stage computes the outputs and the loss, and gradients travel back the same way
(:meth:`forward_backward`). Outputs exist only on the last stage; the workers collect results from it. With
virtual pipeline stages each rank holds ``vpp`` model chunks (chunk ``v`` of rank ``r`` is virtual stage
``v * pp + r``, megatron's interleaved assignment) and the activations go round the ring of ranks ``vpp`` times:
rank 0 chunk 0, rank 1 chunk 0, ..., rank 0 chunk 1, ...; one micro-batch at a time (the order of the
computation, not megatron's overlapped interleaved schedule).

Gradients: averaged over the data-parallel group, summed over tensor ranks for sequence-parallel norms,
summed between the tied embedding copies of the first and last stage; the gradient norm counts each
parameter once (tensor-parallel duplicates and the tied copy excluded), as megatron does. The optimizer is
``optim.optimizer`` (AdamW) over this rank's shards; with ``use_distributed_optimizer`` and more than one
data-parallel rank its state is sharded over the data-parallel group (``ZeroRedundancyOptimizer``).
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import math
from collections.abc import Iterator

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.optim import ZeroRedundancyOptimizer
from transformers import AutoConfig

from verl.models.mcore.dist_ckpt import load_dist_weights
from verl.models.mcore.lora import adapters_disabled, apply_lora, check_lora_settings, save_lora_settings
from verl.models.mcore.model import (ParallelLayout, as_chunks, build_model_chunks, iter_hf_params, iter_hf_tp_shards,
                                     load_hf_weights)
from verl.models.mcore.router_replay import ROUTED_EXPERTS, RoutingReplay, check_router_replay
from verl.models.mcore.settings import (MEGATRON_DTYPES, check_megatron_settings, megatron_settings,
                                       optimizer_overrides, transformer_overrides)
from verl.utils.device import get_device_name
from verl.utils.fsdp_utils import build_lr_scheduler, build_optimizer
from verl.utils.megatron.checkpoint import MegatronCheckpointer, write_hf_dir
from verl.utils.megatron.parallel import init_model_parallel
from verl.utils.megatron.vocab_parallel import chunked_vocab_parallel_log_probs, vocab_parallel_log_probs
from verl.workers.engine.base import TrainEngine
from verl.workers.engine.config import EngineConfig

__all__ = ["MegatronEngine", "megatron_settings", "check_megatron_settings"]

logger = logging.getLogger(__name__)


def _hf_config(config: EngineConfig):
    hf = AutoConfig.from_pretrained(config.model_path, trust_remote_code=config.trust_remote_code)
    for k, v in (config.override_config or {}).items():
        if not isinstance(v, dict):
            setattr(hf, k, v)
    return hf


class MegatronEngine(TrainEngine):
    """One pipeline stage of a tensor/pipeline-parallel GPT model and its optimizer; see the module docstring."""

    def __init__(self, model, hf_config, *, value_head: bool, optimizer=None, lr_scheduler=None, grad_clip=None,
                 sequence_parallel: bool = False, checkpoint_config=None, tokenizer=None, name: str = "engine",
                 model_path: str | None = None, fused_chunk_size: int = 0, lora=None,
                 router_replay: str = "disabled"):
        # optional heavy dependency: megatron-core (~10 s to import) is needed only with strategy=megatron
        from megatron.core import parallel_state as ps

        # the rank's model chunks in virtual-stage order (one without virtual pipeline stages); ``module`` is the
        # model (a ModuleList of the chunks with virtual stages) for parameters(), train() and the like
        self.chunks = as_chunks(model)
        self.module = self.chunks[0] if len(self.chunks) == 1 else nn.ModuleList(self.chunks)
        self.hf_config = hf_config
        self.value_head = value_head
        self.optimizer = optimizer
        self.lr_scheduler = lr_scheduler
        self.grad_clip = grad_clip
        self.sequence_parallel = sequence_parallel
        self.checkpoint_config = checkpoint_config
        self.tokenizer = tokenizer
        self.name = name
        self.model_path = model_path
        # model.use_fused_kernels: log-probs from the last hidden states in chunks of tokens (0: from full logits)
        self.fused_chunk_size = 0 if value_head else int(fused_chunk_size)
        self._head_weight = None  # the output layer's weight seen by the last forward with hidden-state output
        self.layout = ParallelLayout(len(self.chunks))
        self.dp_group = ps.get_data_parallel_group()
        self._dp_size = ps.get_data_parallel_world_size()
        self._embedding_group = ps.get_embedding_group() if self.layout.pp > 1 else None
        self._model_parallel_group = ps.get_model_parallel_group()
        # mixture-of-experts models: expert gradients are averaged over the expert data-parallel group (the ranks
        # holding the same experts), and the gradient norm sums them over the expert model-parallel group
        self._expert_dp_group = ps.get_expert_data_parallel_group()
        self._expert_mp_group = ps.get_expert_tensor_model_pipeline_parallel_group()
        self._checkpointer = None
        self._has_experts = any(getattr(p, "is_expert", False) for p in self.module.parameters())
        self.lora = lora  # verl.models.mcore.lora.LoraSettings when the model carries LoRA adapters (else None)
        # router replay (actor.router_replay.mode=R2): the model's routers were built able to record / replay
        self.routing = None
        if router_replay != "disabled":
            self.routing = RoutingReplay(self.chunks, hf_config, tp=self.layout.tp, tp_rank=self.layout.tp_rank,
                                         sequence_parallel=sequence_parallel, group=self._model_parallel_group)
        self._routing_busy = False

    # ------------------------------------------------------------------ building
    @classmethod
    def build(cls, config: EngineConfig, device_mesh=None, tokenizer=None) -> "MegatronEngine":
        s = megatron_settings(config.megatron)
        hf_config = _hf_config(config)
        on_cpu = get_device_name() == "cpu"
        check_megatron_settings(config.megatron, hf_config, f"{config.name}.megatron", on_cpu=on_cpu)
        lora = check_lora_settings(config.lora, hf_config, f"{config.name}: model.lora", MEGATRON_DTYPES,
                                   megatron=config.megatron)
        if (config.lora_rank > 0 and lora is None) or config.lora_adapter_path:
            raise ValueError(f"{config.name}: model.lora_rank / lora_adapter_path are the FSDP engine's (peft) LoRA keys; "
                             "with strategy=megatron set model.lora.rank (and lora.alpha, lora.target_modules ...)")
        init_model_parallel(s["tp"], s["pp"], s["seed"], owner=config.name, ep=s["ep"], etp=s["etp"])
        dtype = MEGATRON_DTYPES[str(s["dtype"] or config.model_dtype)]
        # a critic's value head and a reward model's score head: the same replicated scalar head (score.weight, one
        # label as the FSDP engine loads a reward model; a checkpoint without it starts at zero)
        value_head = config.model_kind in ("value", "reward")
        overrides = transformer_overrides(config.megatron, f"{config.name}.megatron", on_cpu)
        router_replay = str(config.router_replay or "disabled")
        if router_replay != "disabled":  # every MoE router gets megatron's RouterReplay (see router_replay.py)
            check_router_replay(router_replay, hf_config, f"{config.name}.router_replay.mode", strategy="megatron")
            overrides = dict(overrides, moe_enable_routing_replay=True)
        model = build_model_chunks(hf_config, vpp=s["vpp"], value_head=value_head,
                                   sequence_parallel=s["sequence_parallel"], dtype=dtype, use_cpu_initialization=on_cpu,
                                   overrides=overrides)
        if s["dist_ckpt"]:  # use_dist_checkpointing: tokenizer and HF config still come from model.path
            load_dist_weights(model, s["dist_ckpt"], hf_config, value_head, prefix=s["dist_ckpt_prefix"],
                              key=f"{config.name}.megatron.dist_checkpointing_path")
        else:
            load_hf_weights(model, config.model_path, hf_config, value_head)
        if lora is not None:  # base weights frozen, adapters (B = 0 by default) the only trainable parameters
            apply_lora(model, hf_config, lora, s["seed"], MEGATRON_DTYPES[lora.dtype] if lora.dtype else None)
        model = model[0] if len(model) == 1 else nn.ModuleList(model)
        trainable = config.optim is not None
        optimizer = scheduler = None
        if not trainable:
            model.requires_grad_(False)
        else:
            # optional heavy dependency: megatron-core (~10 s to import) is needed only with strategy=megatron
            from megatron.core import parallel_state as ps

            params = [p for p in model.parameters() if p.requires_grad]
            torch_kwargs = optimizer_overrides(dict(config.optim.override_optimizer_config or {}),
                                               f"{config.name}.optim.override_optimizer_config", on_cpu)
            # experts split over expert-parallel ranks differ between data-parallel ranks: ZeRO over the data-parallel
            # group (which broadcasts each shard's update to the whole group) would overwrite them
            experts_apart = ps.get_expert_data_parallel_world_size() != ps.get_data_parallel_world_size()
            if s["use_distributed_optimizer"] and ps.get_data_parallel_world_size() > 1 and not experts_apart:
                plain = build_optimizer(params, config.optim, torch_kwargs)  # the class and arguments the config names
                accepted = inspect.signature(type(plain).__init__).parameters
                kwargs = {k: v for k, v in plain.defaults.items() if k in accepted and k != "params"}
                optimizer = ZeroRedundancyOptimizer(params, optimizer_class=type(plain),
                                                    process_group=ps.get_data_parallel_group(), **kwargs)
                del plain
            else:
                optimizer = build_optimizer(params, config.optim, torch_kwargs)
            scheduler = build_lr_scheduler(optimizer, config.optim, config.total_training_steps)
        return cls(model, hf_config, value_head=value_head, optimizer=optimizer, lr_scheduler=scheduler,
                   grad_clip=config.grad_clip, sequence_parallel=s["sequence_parallel"],
                   checkpoint_config=config.checkpoint, tokenizer=tokenizer, name=config.name,
                   model_path=config.model_path, fused_chunk_size=config.fused_chunk_size, lora=lora,
                   router_replay=router_replay)

    # ------------------------------------------------------------------ properties
    @property
    def device(self) -> torch.device:
        return next(self.module.parameters()).device

    @property
    def dp_size(self) -> int:
        return self._dp_size

    @property
    def model_config(self):
        return self.hf_config

    @property
    def is_output_rank(self) -> bool:
        """Whether this rank reports its dp group's outputs (tensor rank 0 of the last pipeline stage)."""
        return self.layout.last and self.layout.tp_rank == 0

    # ------------------------------------------------------------------ inputs
    def _aligned(self, micro):
        """Rows shifted so valid tokens start at column 0: (ids (B, L), start (B,), length (B,))."""
        ids, mask = micro["input_ids"], micro["attention_mask"]
        b, t = ids.shape
        lengths = mask.sum(dim=-1)
        starts = torch.argmax((mask > 0).to(torch.int64), dim=-1)
        width = max(int(lengths.max().item()), 2)
        if self.sequence_parallel:
            width = -(width // -self.layout.tp) * self.layout.tp
        cols = torch.arange(width, device=ids.device)
        src = (starts.unsqueeze(1) + cols).clamp(max=t - 1)
        valid = cols.unsqueeze(0) < lengths.unsqueeze(1)
        aligned = torch.where(valid, ids.gather(1, src), torch.zeros_like(ids[:, :1]))
        return aligned, starts, lengths

    def _to_response(self, per_pos: torch.Tensor, micro, starts, lengths) -> torch.Tensor:
        """(B, L) values at aligned positions -> (B, R): the position *before* each response token."""
        t = micro["input_ids"].shape[1]
        r = micro["responses"].shape[-1]
        idx = (t - r - 1) + torch.arange(r, device=per_pos.device).unsqueeze(0) - starts.unsqueeze(1)
        ok = (idx >= 0) & (idx < (lengths - 1).unsqueeze(1)) & (idx < per_pos.shape[1])
        out = per_pos.gather(1, idx.clamp(0, per_pos.shape[1] - 1))
        return torch.where(ok, out, torch.zeros_like(out))

    def _to_columns(self, per_pos: torch.Tensor, micro, starts, lengths) -> torch.Tensor:
        """(B, L) values at aligned positions -> (B, T): back at the columns of ``input_ids``, zeros on padding."""
        t = micro["input_ids"].shape[1]
        idx = torch.arange(t, device=per_pos.device).unsqueeze(0) - starts.unsqueeze(1)
        ok = (idx >= 0) & (idx < lengths.unsqueeze(1)) & (idx < per_pos.shape[1])
        out = per_pos.gather(1, idx.clamp(0, per_pos.shape[1] - 1))
        return torch.where(ok, out, torch.zeros_like(out))

    def _fused(self, outputs) -> bool:
        """Whether this forward's last stage returns hidden states for the chunked log-prob head."""
        return bool(self.fused_chunk_size) and self.layout.last and ("log_probs" in outputs or "entropy" in outputs)

    @contextlib.contextmanager
    def _hidden_state_output(self, enabled: bool):
        """Within the block the model's output layer passes its input through (gathered over the sequence-parallel
        ranks, its gradient summed over the tensor ranks, as the layer's own input path does), so the model returns
        its last hidden states ``(B, L, H)``; the layer's weight (the tied embedding's on a tied model) is kept for
        :func:`chunked_vocab_parallel_log_probs`."""
        if not enabled:
            yield
            return
        # optional heavy dependency: megatron-core (~10 s to import) is needed only with strategy=megatron
        from megatron.core.tensor_parallel import (copy_to_tensor_model_parallel_region,
                                                   gather_from_sequence_parallel_region)

        head = self.chunks[-1].output_layer

        def forward(input_, weight=None, runtime_gather_output=None):
            self._head_weight = head.weight if weight is None else weight
            if head.sequence_parallel:
                return gather_from_sequence_parallel_region(input_), None
            return copy_to_tensor_model_parallel_region(input_), None

        head.forward = forward
        try:
            yield
        finally:
            del head.forward  # back to the class's forward

    def _run_chunk(self, chunk: int, aligned: torch.Tensor, need_grad: bool, hidden_output: bool = False):
        """Forward model chunk ``chunk`` of this rank: receive its input activations from the previous stage of the
        pipeline (unless it holds the embedding), run it (its last hidden states instead of logits with
        ``hidden_output``). Returns (output, received input tensor or None)."""
        # optional heavy dependency: megatron-core (~10 s to import) is needed only with strategy=megatron
        from megatron.core import parallel_state as ps

        model = self.chunks[chunk]
        b, width = aligned.shape
        positions = torch.arange(width, device=aligned.device).unsqueeze(0).expand(b, -1)
        recv = None
        if not self.layout.has_input(chunk):
            # the previous rank in the pipeline ring: for chunk v > 0 of the first rank, the last rank's chunk v - 1
            seq = width // self.layout.tp if self.sequence_parallel else width
            recv = torch.empty(seq, b, self.hf_config.hidden_size, dtype=next(model.parameters()).dtype,
                               device=aligned.device)
            dist.recv(recv, src=ps.get_pipeline_model_parallel_prev_rank())
            recv.requires_grad_(need_grad)
            model.set_input_tensor(recv)
        # True = masked (megatron's convention); passed explicitly, megatron's default mask is built on CUDA
        causal = torch.triu(torch.ones(width, width, dtype=torch.bool, device=aligned.device), diagonal=1)
        with self._hidden_state_output(hidden_output and self.layout.has_output(chunk)):
            out = model(input_ids=aligned, position_ids=positions, attention_mask=causal[None, None])
        return out, recv

    def _forward_chunks(self, aligned: torch.Tensor, need_grad: bool, hidden_output: bool = False):
        """Run the micro-batch through this rank's model chunks in virtual-stage order, each chunk's output sent to
        the next stage of the pipeline ring (megatron's interleaved order: rank 0 chunk 0, rank 1 chunk 0, ...,
        rank 0 chunk 1, ...). Returns the model's output on the rank holding the output layer (else None) and
        each chunk's (input, output) for :meth:`_backward_chunks`."""
        trace = []
        for v in range(len(self.chunks)):
            out, recv = self._run_chunk(v, aligned, need_grad, hidden_output)
            if not self.layout.has_output(v):
                self._send_next(out)
            trace.append((recv, out))
        final = trace[-1][1] if self.layout.has_output(len(self.chunks) - 1) else None
        return final, trace

    def _backward_chunks(self, trace, loss: torch.Tensor | None) -> None:
        """The backward of :meth:`_forward_chunks` in reverse order: the output chunk starts from ``loss``, the
        others from the gradient their output's consumer sends back; each sends its input's gradient to the
        stage it came from."""
        # optional heavy dependency: megatron-core (~10 s to import) is needed only with strategy=megatron
        from megatron.core import parallel_state as ps

        for v in reversed(range(len(self.chunks))):
            recv, out = trace[v]
            if self.layout.has_output(v):
                loss.backward()
            else:
                grad = torch.empty_like(out)
                dist.recv(grad, src=ps.get_pipeline_model_parallel_next_rank())
                torch.autograd.backward(out, grad)
            if recv is not None:
                dist.send(recv.grad.contiguous(), dst=ps.get_pipeline_model_parallel_prev_rank())

    def _outputs_from(self, out, micro, aligned, starts, lengths, outputs, temperature, entropy_grad) -> dict:
        result = {}
        if self._fused(outputs):
            lp, ent = chunked_vocab_parallel_log_probs(out[:, :-1], self._head_weight, aligned[:, 1:],
                                                       self.hf_config.vocab_size, temperature=temperature,
                                                       chunk_size=self.fused_chunk_size,
                                                       with_entropy="entropy" in outputs, entropy_grad=entropy_grad)
            result["log_probs"] = self._to_response(lp, micro, starts, lengths)
            if ent is not None:
                result["entropy"] = self._to_response(ent, micro, starts, lengths)
        elif "log_probs" in outputs or "entropy" in outputs:
            logits = out[:, :-1] / temperature if temperature != 1.0 else out[:, :-1]
            lp, ent = vocab_parallel_log_probs(logits, aligned[:, 1:], self.hf_config.vocab_size,
                                               with_entropy="entropy" in outputs, entropy_grad=entropy_grad)
            result["log_probs"] = self._to_response(lp, micro, starts, lengths)
            if ent is not None:
                result["entropy"] = self._to_response(ent, micro, starts, lengths)
        if "values" in outputs:
            result["values"] = self._to_response(out[..., 0].float(), micro, starts, lengths)
        if "scores" in outputs:  # a reward model's head at every column of input_ids (zeros on padding)
            result["scores"] = self._to_columns(out[..., 0].float(), micro, starts, lengths)
        if "logits" in outputs:
            raise ValueError("the Megatron engine does not return full logits (vocabulary-parallel); use the FSDP "
                             "engine for a distillation loss over the vocabulary")
        return result

    # ------------------------------------------------------------------ router replay
    def routing_replay_unsupported(self) -> str | None:
        if self.routing is not None:
            return None
        return (f"{self.name}: this Megatron engine was built without router replay (a mixture-of-experts model "
                "with actor.router_replay.mode=R2 builds it)")

    @contextlib.contextmanager
    def _routing_for(self, micro, record: bool):
        """Around one micro-batch's forward (and, in training, its backward): replay the ``routed_experts`` the
        micro-batch carries, else with ``record`` keep each router's choice. Yields a dict that holds, after the
        block, ``routed_experts`` for the micro-batch's rows when ``record`` (collective over the model-parallel
        group); nested calls (the training step's forward inside its own block) do nothing."""
        replay = ROUTED_EXPERTS in micro.keys()
        if self._routing_busy or not (record or replay):
            yield {}
            return
        reason = self.routing_replay_unsupported()
        if reason is not None:
            raise ValueError(reason)
        aligned, starts, lengths = self._aligned(micro)
        width = aligned.shape[1]
        state = {}
        self._routing_busy = True
        try:
            if replay:
                self.routing.replay(micro[ROUTED_EXPERTS], starts, lengths, width)
            else:
                self.routing.record()
            yield state
            if record:  # a replayed micro-batch's routing is the one it carries
                state[ROUTED_EXPERTS] = micro[ROUTED_EXPERTS].to(self.routing.dtype) if replay else \
                    self.routing.recorded(aligned.shape[0], width, micro["input_ids"].shape[1], starts, lengths,
                                          aligned.device)
        finally:
            self.routing.clear()
            self._routing_busy = False

    def forward_micro_batch(self, micro, outputs, temperature, entropy_grad):
        want_routing = ROUTED_EXPERTS in outputs
        outputs = tuple(name for name in outputs if name != ROUTED_EXPERTS)
        with self._routing_for(micro, record=want_routing) as routing:
            result = self._forward_outputs(micro, outputs, temperature, entropy_grad)
        if want_routing:
            if ROUTED_EXPERTS not in routing:
                raise ValueError(f"{self.name}: routed_experts is recorded by a forward-only pass (infer), not "
                                 "inside a training step")
            result[ROUTED_EXPERTS] = routing[ROUTED_EXPERTS]
        return result

    def _forward_outputs(self, micro, outputs, temperature, entropy_grad) -> dict:
        aligned, starts, lengths = self._aligned(micro)
        out, _ = self._forward_chunks(aligned, torch.is_grad_enabled(), self._fused(outputs))
        if out is None:  # outputs live on the last stage
            b, r = micro["responses"].shape if "responses" in micro.keys() else (aligned.shape[0], 1)
            return {name: torch.zeros(micro["input_ids"].shape if name == "scores" else (b, r), device=aligned.device)
                    for name in outputs}
        return self._outputs_from(out, micro, aligned, starts, lengths, outputs, temperature, entropy_grad)

    def _send_next(self, out) -> None:
        # optional heavy dependency: megatron-core (~10 s to import) is needed only with strategy=megatron
        from megatron.core import parallel_state as ps

        dist.send(out.detach().contiguous(), dst=ps.get_pipeline_model_parallel_next_rank())

    def forward_backward(self, micro, loss_fn, spec, ctx, weight):
        # router replay: a micro-batch that carries routed_experts uses those experts in its forward and in the
        # recomputation of its layers during backward (recompute_granularity), which runs inside this block
        with self._routing_for(micro, record=False):
            return self._forward_backward(micro, loss_fn, spec, ctx, weight)

    def _forward_backward(self, micro, loss_fn, spec, ctx, weight):
        if self.layout.pp == 1:
            return super().forward_backward(micro, loss_fn, spec, ctx, weight)
        aligned, starts, lengths = self._aligned(micro)
        out, trace = self._forward_chunks(aligned, True, self._fused(spec.outputs))
        metrics, loss = {}, None
        if out is not None:
            outputs = self._outputs_from(out, micro, aligned, starts, lengths, spec.outputs, spec.temperature,
                                         spec.entropy_grad)
            loss, metrics = loss_fn(outputs, micro, ctx)
            loss = loss * weight
        self._backward_chunks(trace, loss)
        return metrics

    # ------------------------------------------------------------------ gradients and steps
    def train_mode(self, training: bool) -> None:
        self.module.train(training)

    def zero_grad(self) -> None:
        self._require_optimizer()
        self.optimizer.zero_grad(set_to_none=True)

    def _params(self):
        return [p for p in self.module.parameters() if p.requires_grad]

    def _finalize_grads(self) -> None:
        """Make every shard's gradient the full-model gradient (see module docstring)."""
        for p in self._params():
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        if self.layout.tp > 1:
            for p in self._params():
                # sequence-parallel norms (each tensor rank saw a slice of the sequence) and per-head query / key
                # norms (each saw its own heads)
                if (self.sequence_parallel and getattr(p, "sequence_parallel", False)) or \
                        getattr(p, "sum_grad_over_tp", False):
                    dist.all_reduce(p.grad, group=self.layout.tp_group)
        if self._embedding_group is not None and self.hf_config.tie_word_embeddings and not self.value_head:
            shared = None
            if self.layout.first:
                shared = self.chunks[0].embedding.word_embeddings.weight
            elif self.layout.last:
                shared = self.chunks[-1].output_layer.weight
            if shared is not None:
                dist.all_reduce(shared.grad, group=self._embedding_group)
        expert_dp_size = dist.get_world_size(self._expert_dp_group)
        for p in self._params():
            # an expert's gradient holds the tokens the dispatcher brought to it from other ranks: summed over the
            # ranks holding the same expert (megatron's expert data-parallel group), scaled as the others
            expert = getattr(p, "is_expert", False)
            if (expert_dp_size if expert else self._dp_size) > 1:
                dist.all_reduce(p.grad, group=self._expert_dp_group if expert else self.dp_group)
            if self._dp_size > 1:
                p.grad.div_(self._dp_size)

    def _grad_norm(self) -> float:
        total = torch.zeros(1, dtype=torch.float64, device=self.device)
        experts = torch.zeros(1, dtype=torch.float64, device=self.device)
        for p in self._params():
            expert = getattr(p, "is_expert", False)
            cut_rank = self.layout.etp_rank if expert else self.layout.tp_rank
            duplicate = not getattr(p, "tensor_model_parallel", False) and cut_rank != 0
            tied_copy = bool(getattr(p, "shared", False)) and not self.layout.first
            if not duplicate and not tied_copy:
                (experts if expert else total).add_(p.grad.detach().double().pow(2).sum())
        dist.all_reduce(total, group=self._model_parallel_group)
        if self.layout.ep * self.layout.etp > 1 or self.layout.pp > 1:
            dist.all_reduce(experts, group=self._expert_mp_group)
        return float((total + experts).sqrt().item())

    def optimizer_step(self) -> float:
        self._require_optimizer()
        self._finalize_grads()
        grad_norm = self._grad_norm()
        if math.isfinite(grad_norm):
            if self.grad_clip is not None and self.grad_clip > 0:
                coef = self.grad_clip / (grad_norm + 1e-6)
                if coef < 1.0:
                    for p in self._params():
                        p.grad.mul_(coef)
            self.optimizer.step()
        else:
            logger.warning("%s: non-finite grad norm %s, skipping this optimizer step", self.name, grad_norm)
        self.optimizer.zero_grad(set_to_none=True)
        return grad_norm

    # ------------------------------------------------------------------ weights out
    def iter_full_params(self, stats: dict | None = None,
                         bucket_bytes: int | None = None) -> Iterator[tuple[str, torch.Tensor]]:
        # one parameter at a time whatever bucket_bytes says: each is gathered across its tensor-parallel group
        yield from iter_hf_params(self.chunks, self.hf_config, self.value_head, stats)

    @property
    def tensor_parallel_size(self) -> int:
        """The tensor-parallel size the rollout weight push matches against its engine's (a mixture-of-experts model
        reports 1: its weights are pushed as full tensors, see :func:`~verl.models.mcore.model.iter_hf_tp_shards`)."""
        return 1 if self._has_experts else self.layout.tp

    def iter_tp_shards(self, vocab_range: tuple[int, int], stats: dict | None = None
                       ) -> Iterator[tuple[str, torch.Tensor]]:
        """This rank's tensor-parallel pieces under HF names, for an inference engine of the same tensor-parallel
        size on the same ranks (no gather; see :func:`verl.models.mcore.model.iter_hf_tp_shards`)."""
        if self.value_head:
            raise RuntimeError(f"{self.name}: a value model is never pushed to a rollout engine")
        yield from iter_hf_tp_shards(self.chunks, self.hf_config, vocab_range, stats)

    def _checkpoints(self) -> MegatronCheckpointer:
        self._require_optimizer()
        if self._checkpointer is None:
            self._checkpointer = MegatronCheckpointer(self)
        return self._checkpointer

    def save_checkpoint(self, local_path: str, global_step: int = 0, max_ckpt_to_keep: int | None = None) -> None:
        self._checkpoints().save(local_path, global_step, max_ckpt_to_keep)
        if self.lora is not None and dist.get_rank() == 0:  # the model merger rebuilds the adapters from it
            save_lora_settings(self.lora, local_path)

    def disable_adapter(self):
        """Within the block the model runs without its LoRA adapters: the base model (LoRA's reference policy)."""
        return adapters_disabled(self.chunks)

    def load_checkpoint(self, local_path: str, del_local_after_load: bool = False) -> None:
        self._checkpoints().load(local_path, del_local_after_load)

    def save_hf_model(self, out_dir: str, tokenizer=None) -> str | None:
        rank = dist.get_rank()
        return write_hf_dir(self.iter_full_params(), self.hf_config, out_dir, tokenizer or self.tokenizer,
                            value_head=self.value_head, write=rank == 0)

    def _require_optimizer(self) -> None:
        if self.optimizer is None:
            raise RuntimeError(f"{self.name}: this engine is forward-only (built without an optimizer); training "
                               "and checkpoints need one")

