"""The Megatron training engine: a megatron-core ``GPTModel`` with tensor, sequence and pipeline parallelism.

``MegatronEngine.build(EngineConfig, ...)`` (``strategy=megatron``) reads ``<role>.megatron.*``:
``tensor_model_parallel_size``, ``pipeline_model_parallel_size``, ``sequence_parallel`` (forced off at TP=1),
``use_distributed_optimizer``, ``seed``, ``dtype``; the offload keys are no-ops on CPU (the weights already live
in host memory). Keys megatron-core cannot honour here (virtual pipeline stages, context / expert parallelism)
are refused naming the key.

How a micro-batch runs: each row is shifted so its valid tokens start at column 0 (left-padded prompts and
right-padded responses are contiguous), which makes rotary positions equal the HF ``position_ids`` and the
causal mask sufficient; columns are trimmed to the longest row (a multiple of the TP size with sequence
parallel). Log-probs and entropies come from the vocabulary-parallel logits
(``verl.utils.megatron.vocab_parallel``); with ``model.use_fused_kernels`` the model returns its last hidden
states and the logits are formed a chunk of tokens at a time (recomputed in backward), so the full
``[tokens, vocabulary / TP]`` logits never exist. The critic's values come from a replicated scalar head.

Pipeline parallel: each micro-batch goes forward stage by stage (activations sent point-to-point to the next
stage), the last stage computes the outputs and the loss, and gradients travel back the same way
(:meth:`forward_backward`). Outputs exist only on the last stage; the workers collect results from it.

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
from torch.distributed.optim import ZeroRedundancyOptimizer
from transformers import AutoConfig

from verl.models.mcore.model import ParallelLayout, build_gpt_model, iter_hf_params, iter_hf_tp_shards, load_hf_weights
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
                 model_path: str | None = None, fused_chunk_size: int = 0):
        # optional heavy dependency: megatron-core (~10 s to import) is needed only with strategy=megatron
        from megatron.core import parallel_state as ps

        self.module = model
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
        self.layout = ParallelLayout()
        self.dp_group = ps.get_data_parallel_group()
        self._dp_size = ps.get_data_parallel_world_size()
        self._embedding_group = ps.get_embedding_group() if self.layout.pp > 1 else None
        self._model_parallel_group = ps.get_model_parallel_group()
        self._checkpointer = None

    # ------------------------------------------------------------------ building
    @classmethod
    def build(cls, config: EngineConfig, device_mesh=None, tokenizer=None) -> "MegatronEngine":
        s = megatron_settings(config.megatron)
        hf_config = _hf_config(config)
        on_cpu = get_device_name() == "cpu"
        check_megatron_settings(config.megatron, hf_config, f"{config.name}.megatron", on_cpu=on_cpu)
        if config.lora_rank > 0:
            raise ValueError(f"{config.name}: LoRA (model.lora_rank={config.lora_rank}) is not available with "
                             "strategy=megatron; use strategy=fsdp for LoRA")
        if config.model_kind == "reward":
            raise ValueError("reward_model.strategy=megatron is not available (sequence-classification heads); "
                             "use reward_model.strategy=fsdp or a rule-based reward")
        init_model_parallel(s["tp"], s["pp"], s["seed"], owner=config.name)
        dtype = MEGATRON_DTYPES[str(s["dtype"] or config.model_dtype)]
        value_head = config.model_kind == "value"
        model = build_gpt_model(hf_config, value_head=value_head, sequence_parallel=s["sequence_parallel"],
                                dtype=dtype, use_cpu_initialization=on_cpu,
                                overrides=transformer_overrides(config.megatron, f"{config.name}.megatron", on_cpu))
        load_hf_weights(model, config.model_path, hf_config, value_head)
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
            if s["use_distributed_optimizer"] and ps.get_data_parallel_world_size() > 1:
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
                   model_path=config.model_path, fused_chunk_size=config.fused_chunk_size)

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

        head = self.module.output_layer

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

    def _run_stage(self, aligned: torch.Tensor, need_grad: bool, hidden_output: bool = False):
        """Forward this stage: receive the previous stage's activations (pipeline), run the model (its last hidden
        states instead of logits with ``hidden_output``). Returns (output, received input tensor or None)."""
        # optional heavy dependency: megatron-core (~10 s to import) is needed only with strategy=megatron
        from megatron.core import parallel_state as ps

        b, width = aligned.shape
        positions = torch.arange(width, device=aligned.device).unsqueeze(0).expand(b, -1)
        recv = None
        if not self.layout.first:
            seq = width // self.layout.tp if self.sequence_parallel else width
            recv = torch.empty(seq, b, self.hf_config.hidden_size, dtype=next(self.module.parameters()).dtype,
                               device=aligned.device)
            dist.recv(recv, src=ps.get_pipeline_model_parallel_prev_rank())
            recv.requires_grad_(need_grad)
            self.module.set_input_tensor(recv)
        # True = masked (megatron's convention); passed explicitly, megatron's default mask is built on CUDA
        causal = torch.triu(torch.ones(width, width, dtype=torch.bool, device=aligned.device), diagonal=1)
        with self._hidden_state_output(hidden_output):
            out = self.module(input_ids=aligned, position_ids=positions, attention_mask=causal[None, None])
        return out, recv

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
        if "scores" in outputs:
            raise ValueError("the Megatron engine has no sequence-classification head (scores)")
        if "logits" in outputs:
            raise ValueError("the Megatron engine does not return full logits (vocabulary-parallel); use the FSDP "
                             "engine for a distillation loss over the vocabulary")
        return result

    def forward_micro_batch(self, micro, outputs, temperature, entropy_grad):
        aligned, starts, lengths = self._aligned(micro)
        out, _ = self._run_stage(aligned, torch.is_grad_enabled(), self._fused(outputs))
        if not self.layout.last:
            self._send_next(out)
            b, r = micro["responses"].shape
            return {name: torch.zeros(b, r, device=aligned.device) for name in outputs}  # outputs live on the last stage
        return self._outputs_from(out, micro, aligned, starts, lengths, outputs, temperature, entropy_grad)

    def _send_next(self, out) -> None:
        # optional heavy dependency: megatron-core (~10 s to import) is needed only with strategy=megatron
        from megatron.core import parallel_state as ps

        dist.send(out.detach().contiguous(), dst=ps.get_pipeline_model_parallel_next_rank())

    def forward_backward(self, micro, loss_fn, spec, ctx, weight):
        if self.layout.pp == 1:
            return super().forward_backward(micro, loss_fn, spec, ctx, weight)
        # optional heavy dependency: megatron-core (~10 s to import) is needed only with strategy=megatron
        from megatron.core import parallel_state as ps

        aligned, starts, lengths = self._aligned(micro)
        out, recv = self._run_stage(aligned, True, self._fused(spec.outputs))
        metrics = {}
        if self.layout.last:
            outputs = self._outputs_from(out, micro, aligned, starts, lengths, spec.outputs, spec.temperature,
                                         spec.entropy_grad)
            loss, metrics = loss_fn(outputs, micro, ctx)
            (loss * weight).backward()
        else:
            self._send_next(out)
            grad = torch.empty_like(out)
            dist.recv(grad, src=ps.get_pipeline_model_parallel_next_rank())
            torch.autograd.backward(out, grad)
        if recv is not None:
            dist.send(recv.grad.contiguous(), dst=ps.get_pipeline_model_parallel_prev_rank())
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
        if self.layout.tp > 1 and self.sequence_parallel:
            for p in self._params():
                if getattr(p, "sequence_parallel", False):
                    dist.all_reduce(p.grad, group=self.layout.tp_group)
        if self._embedding_group is not None and self.hf_config.tie_word_embeddings and not self.value_head:
            shared = None
            if self.layout.first:
                shared = self.module.embedding.word_embeddings.weight
            elif self.layout.last:
                shared = self.module.output_layer.weight
            if shared is not None:
                dist.all_reduce(shared.grad, group=self._embedding_group)
        if self._dp_size > 1:
            for p in self._params():
                dist.all_reduce(p.grad, group=self.dp_group)
                p.grad.div_(self._dp_size)

    def _grad_norm(self) -> float:
        total = torch.zeros(1, dtype=torch.float64, device=self.device)
        for p in self._params():
            duplicate = not getattr(p, "tensor_model_parallel", False) and self.layout.tp_rank != 0
            tied_copy = bool(getattr(p, "shared", False)) and not self.layout.first
            if not duplicate and not tied_copy:
                total += p.grad.detach().double().pow(2).sum()
        dist.all_reduce(total, group=self._model_parallel_group)
        return float(total.sqrt().item())

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
        yield from iter_hf_params(self.module, self.hf_config, self.value_head, stats)

    @property
    def tensor_parallel_size(self) -> int:
        return self.layout.tp

    def iter_tp_shards(self, vocab_range: tuple[int, int], stats: dict | None = None
                       ) -> Iterator[tuple[str, torch.Tensor]]:
        """This rank's tensor-parallel pieces under HF names, for an inference engine of the same tensor-parallel
        size on the same ranks (no gather; see :func:`verl.models.mcore.model.iter_hf_tp_shards`)."""
        if self.value_head:
            raise RuntimeError(f"{self.name}: a value model is never pushed to a rollout engine")
        yield from iter_hf_tp_shards(self.module, self.hf_config, vocab_range, stats)

    def _checkpoints(self) -> MegatronCheckpointer:
        self._require_optimizer()
        if self._checkpointer is None:
            self._checkpointer = MegatronCheckpointer(self)
        return self._checkpointer

    def save_checkpoint(self, local_path: str, global_step: int = 0, max_ckpt_to_keep: int | None = None) -> None:
        self._checkpoints().save(local_path, global_step, max_ckpt_to_keep)

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

