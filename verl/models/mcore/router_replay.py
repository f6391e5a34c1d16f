"""Router replay (``actor.router_replay.mode=R2``) for megatron-core mixture-of-experts models.

Used by the Megatron engine (``verl.workers.engine.megatron``). Each MoE layer's ``TopKRouter`` picks ``k`` experts
per token. With ``moe_enable_routing_replay`` megatron-core gives every router a ``RouterReplay`` whose action
decides how that top-k is formed: computed and kept (``RECORD``), or taken from given indices (``REPLAY_FORWARD``;
the router then only gathers its scores at those experts, so the gate's gradient still flows). :class:`RoutingReplay`
drives the routers of one model replica (this rank's chunks) and moves the decisions between megatron's token order
and the batch's rows.

The recorded routing is keyed by row and column of ``input_ids``, never by micro-batch: ``routed_experts`` is a
``(B, T, L, k)`` integer tensor (``T`` the columns of ``input_ids``, ``L`` the model's MoE layers in layer order,
``k`` the router's top-k; zeros at padding), so it travels with its rows through a ``DataProto`` however the update
shuffles and cuts the batch (mini-batches, fixed or token-budget micro-batches). Inside a micro-batch the engine
shifts every row so its valid tokens start at column 0 and trims the columns to the longest row; a router sees the
hidden states as ``[sequence, batch]`` flattened sequence-major, and with sequence parallel each tensor rank only its
``width / tp`` slice of the sequence. Recording gathers the slices of the tensor ranks and the layers of the
pipeline stages (and virtual stages) into one tensor on every rank of the model-parallel group; replaying cuts each
rank's slice and layers back out of the rows it is given.

Padding positions of a replayed micro-batch (after a row's last valid token) are routed to experts ``0 .. k-1``:
causal attention keeps them out of every valid token's computation, and without a capacity factor a token's
experts do not depend on the other tokens, so the valid tokens' outputs are those of the recorded routing (with a
``moe_expert_capacity_factor`` override, which tokens an expert drops depends on the whole micro-batch and is not
replayed).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from verl.models.mcore import get_arch
from verl.trainer.config_schema.actor import R3_REFUSED

__all__ = ["ROUTED_EXPERTS", "RoutingReplay", "moe_layer_indices", "routing_dtype", "check_router_replay"]

ROUTED_EXPERTS = "routed_experts"


def moe_layer_indices(hf_config) -> list[int]:
    """The global indices of the decoder layers whose MLP is a mixture of experts (the ``L`` axis of the
    recorded routing, in this order)."""
    arch = get_arch(hf_config)
    if not arch.experts:
        return []
    return [i for i in range(int(hf_config.num_hidden_layers)) if arch.is_moe_layer(hf_config, i)]


def check_router_replay(mode, hf_config, key: str, strategy: str) -> None:
    """Refuse, naming ``key`` (``<role>.router_replay.mode``), a router-replay mode this build cannot run for a
    model ``hf_config`` on engine ``strategy`` (``hf_config`` None: the model is not checked)."""
    if mode in (None, "disabled"):
        return
    if mode == "R3":
        raise ValueError(f"{key}=R3 is not supported: {R3_REFUSED}")
    if mode != "R2":
        raise ValueError(f"{key}={mode!r} is not one of disabled, R2, R3")
    if strategy != "megatron":
        raise ValueError(f"{key}=R2 replays megatron-core's router decisions and needs the Megatron engine, but "
                         f"strategy={strategy!r} (the FSDP engine runs the Hugging Face model, whose routers cannot "
                         "replay); set actor_rollout_ref.actor.strategy=megatron or router_replay.mode=disabled")
    if hf_config is not None and not moe_layer_indices(hf_config):
        archs = ", ".join(getattr(hf_config, "architectures", None) or [str(hf_config.model_type)])
        raise ValueError(f"{key}=R2: the model ({archs}) has no mixture-of-experts layers, so there is no routing "
                         f"to record or replay; set {key}=disabled")


def routing_dtype(num_experts: int) -> torch.dtype:
    """The smallest integer type that holds an expert index (``uint8`` up to 256 experts)."""
    if num_experts <= 256:
        return torch.uint8
    if num_experts <= 2 ** 15:
        return torch.int16
    return torch.int32


class RoutingReplay:
    """The replayable routers of this rank's model chunks (built with ``moe_enable_routing_replay=True``).

    ``chunks``: the rank's ``GPTModel`` chunks; ``hf_config``: the model's HF config (which layers are MoE);
    ``tp`` / ``tp_rank`` and ``sequence_parallel``: how the sequence is split among tensor ranks;
    ``group``: the model-parallel group (tensor x pipeline ranks of one data-parallel rank) the recorded decisions
    are gathered over."""

    def __init__(self, chunks, hf_config, *, tp: int, tp_rank: int, sequence_parallel: bool, group=None):
        layers = moe_layer_indices(hf_config)
        self.num_layers = len(layers)
        ordinal = {layer: i for i, layer in enumerate(layers)}
        self.routers = []  # (MoE-layer ordinal, RouterReplay) of this rank's layers
        self.topk = self.num_experts = None
        for chunk in chunks:
            for layer in chunk.decoder.layers:
                router = getattr(getattr(layer, "mlp", None), "router", None)
                replay = getattr(router, "router_replay", None)
                if replay is None:
                    continue
                index = int(layer.layer_number) - 1  # megatron numbers layers globally from 1
                if index not in ordinal:
                    raise RuntimeError(f"router replay: layer {index} has a router but is not a mixture-of-experts "
                                       f"layer of {type(hf_config).__name__}")
                self.routers.append((ordinal[index], replay))
                self.topk, self.num_experts = int(router.topk), int(router.config.num_moe_experts)
        self._release_global_instances()
        if self.topk is None:  # a pipeline stage without MoE layers: take the sizes from the config
            self.topk = int(getattr(hf_config, "num_experts_per_tok", 1) or 1)
            self.num_experts = int(getattr(hf_config, "num_experts", None) or getattr(hf_config, "n_routed_experts",
                                                                                       None) or 1)
        self.dtype = routing_dtype(self.num_experts)
        self.tp, self.tp_rank = int(tp), int(tp_rank)
        self.sequence_parallel = bool(sequence_parallel) and self.tp > 1
        self.group = group
        self._group_size = dist.get_world_size(group) if group is not None and dist.is_initialized() else 1

    def _release_global_instances(self) -> None:
        """megatron keeps every RouterReplay it creates in a class-level list (for its global set / clear calls,
        which this class does not use: each model drives its own routers). Dropping ours from it lets a model that
        is deleted be freed, and keeps another model's global calls off these routers."""
        # optional heavy dependency: megatron-core (~10 s to import) is needed only with strategy=megatron
        from megatron.core.transformer.moe.router_replay import RouterReplay

        mine = {id(r) for _, r in self.routers}
        RouterReplay.global_router_replay_instances[:] = [
            r for r in RouterReplay.global_router_replay_instances if id(r) not in mine]

    # ------------------------------------------------------------------ positions
    def _local_columns(self, width: int) -> tuple[int, int]:
        """(first aligned column, count) of the sequence slice this rank's routers see."""
        if self.sequence_parallel:
            local = width // self.tp
            return self.tp_rank * local, local
        return 0, width

    # ------------------------------------------------------------------ actions
    def record(self) -> None:
        """The next forward keeps each router's top-k indices."""
        # optional heavy dependency: megatron-core (~10 s to import) is needed only with strategy=megatron
        from megatron.core.transformer.moe.router_replay import RouterReplayAction

        for _, replay in self.routers:
            replay.clear_indices()
            replay.set_router_replay_action(RouterReplayAction.RECORD)

    def replay(self, routed: torch.Tensor, starts: torch.Tensor, lengths: torch.Tensor, width: int) -> None:
        """Until :meth:`clear`, every forward of the routers (and its recomputation in backward) uses ``routed``:
        ``(B, T, L, k)`` by rows and columns of ``input_ids``, for a micro-batch whose rows' valid tokens start at
        column ``starts`` and number ``lengths`` and that runs ``width`` aligned columns."""
        # optional heavy dependency: megatron-core (~10 s to import) is needed only with strategy=megatron
        from megatron.core.transformer.moe.router_replay import RouterReplayAction

        b, t = routed.shape[:2]
        if routed.dim() != 4 or routed.shape[2] != self.num_layers or routed.shape[3] != self.topk:
            raise ValueError(f"router replay: {ROUTED_EXPERTS} has shape {tuple(routed.shape)}, but this model needs "
                             f"(rows, columns, {self.num_layers} MoE layers, top-{self.topk}); it must come from the "
                             "same model's recording (actor compute_log_prob with router_replay.mode=R2)")
        cols = torch.arange(width, device=routed.device)
        src = (starts.to(routed.device).unsqueeze(1) + cols).clamp(max=t - 1)  # (B, width)
        valid = cols.unsqueeze(0) < lengths.to(routed.device).unsqueeze(1)
        aligned = routed.gather(1, src[:, :, None, None].expand(-1, -1, self.num_layers, self.topk)).long()
        filler = torch.arange(self.topk, device=routed.device)  # distinct experts for the padding tokens
        aligned = torch.where(valid[:, :, None, None], aligned, filler)
        if int(aligned.max()) >= self.num_experts:
            raise ValueError(f"router replay: {ROUTED_EXPERTS} names expert {int(aligned.max())}, but the model has "
                             f"{self.num_experts} experts per layer")
        first, count = self._local_columns(width)
        for layer, replay in self.routers:
            # the router's tokens: [sequence slice, batch] flattened sequence-major
            target = aligned[:, first:first + count, layer].transpose(0, 1).reshape(-1, self.topk).contiguous()
            replay.clear_indices()
            replay.set_target_indices(target)
            replay.set_router_replay_action(RouterReplayAction.REPLAY_FORWARD)

    def clear(self) -> None:
        """Back to plain routing; indices dropped."""
        for _, replay in self.routers:
            replay.clear_indices()
            replay.clear_router_replay_action()

    # ------------------------------------------------------------------ results
    def recorded(self, batch: int, width: int, columns: int, starts: torch.Tensor, lengths: torch.Tensor,
                 device) -> torch.Tensor:
        """After a forward under :meth:`record`: the micro-batch's routing as ``(B, columns, L, k)`` at the columns
        of its ``input_ids`` (zeros at padding), the same on every rank of the model-parallel group (collective)."""
        first, count = self._local_columns(width)
        full = torch.zeros(batch, width, self.num_layers, self.topk, dtype=torch.int32, device=device)
        # each position of each layer is filled by exactly one rank (without sequence parallel, tensor rank 0)
        mine = self.sequence_parallel or self.tp_rank == 0
        for layer, replay in self.routers:
            indices = replay.get_recorded_indices()
            if indices is None:
                raise RuntimeError("router replay: a router recorded nothing in this forward")
            if mine:
                full[:, first:first + count, layer] = indices.view(count, batch, self.topk).transpose(0, 1).to(
                    device=device, dtype=torch.int32)
        if self._group_size > 1:
            dist.all_reduce(full, group=self.group)
        idx = torch.arange(columns, device=device).unsqueeze(0) - starts.to(device).unsqueeze(1)  # (B, columns)
        ok = (idx >= 0) & (idx < lengths.to(device).unsqueeze(1)) & (idx < width)
        out = full.gather(1, idx.clamp(0, width - 1)[:, :, None, None].expand(-1, -1, self.num_layers, self.topk))
        return torch.where(ok[:, :, None, None], out, torch.zeros_like(out)).to(self.dtype)
