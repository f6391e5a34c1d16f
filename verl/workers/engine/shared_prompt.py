"""Preference pairs that share their prompt: one packed row ``[prompt | chosen | rejected]`` per pair.

The engine's pair layout is two rows per pair (``[chosen_0, rejected_0, chosen_1, ...]``, each row a left-padded
prompt and a right-padded response) and runs the prompt twice. Packed, each pair becomes one row::

    columns   [ pad ... | prompt (p) | chosen (c) | rejected (r) | pad ... ]
    positions             0 .. p-1     p .. p+c-1   p .. p+r-1

with a block attention mask: every token attends causally to the prompt and to earlier tokens of its own
segment, so the rejected tokens see the prompt and themselves but never the chosen tokens. Every token then
sees exactly the keys (and positions) it sees in its own unpacked row, so the log-probs are those of the
two-row layout -- the prompt's hidden states are computed once and feed both responses (and both gradients).

Prompts are left-padded to the micro-batch's longest prompt, so every chosen response starts in the same
column and the logits are computed only from the last prompt column on (``logits_to_keep``); the row is as
wide as the longest prompt plus the longest chosen + rejected pair of the micro-batch.

The mask is a 4-D ``(rows, 1, W, W)`` tensor handed to the model as ``attention_mask``; Hugging Face models
built on ``transformers.masking_utils`` use such a mask as given. :func:`unsupported_reason` says when that is
not known to hold (model families outside ``SUPPORTED_MODEL_TYPES``, attention kernels other than sdpa / eager,
sliding-window layers, vision inputs); callers then keep the two-row layout.

Groups (GRPO and other ``rollout.n > 1`` batches): :func:`pack_groups` is the general form, and pairs are packed
with it too. Each run of consecutive rows that share a prompt (the ``n`` samples of one prompt sit next to each
other in a batch) becomes one row ``[prompt | response_1 | ... | response_k]``, each response seeing the prompt
and itself.
:func:`forward_grouped_log_probs` computes every row's log-probs from it, in row order, when the packed rows
cost less than the plain ones (:func:`grouping_pays`); otherwise it returns None and the caller runs the plain
forward.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from verl.utils.dataset.vision_utils import MM_KEYS
from verl.utils.torch_functional import entropy_for_loss, logprobs_from_logits
from verl.workers.engine.hf_forward import accepts_logits_to_keep, token_values

__all__ = ["SUPPORTED_MODEL_TYPES", "SUPPORTED_ATTENTION", "unsupported_reason", "pack_pairs",
           "block_attention_mask", "forward_shared_prompt_log_probs", "PackedGroups", "prompt_runs", "pack_groups",
           "grouping_pays", "forward_grouped_log_probs", "forward_grouped_values"]

#: model families whose decoder takes a custom 4-D attention mask as given (checked by the tests for the first two)
SUPPORTED_MODEL_TYPES = ("qwen2", "llama", "qwen3", "mistral")
#: attention kernels that apply an arbitrary dense mask (flash-attention kernels only know padding / packing)
SUPPORTED_ATTENTION = ("sdpa", "eager", "verl_varlen")  # verl_varlen takes a dense mask as sdpa does

PROMPT, CHOSEN, REJECTED, PAD = 0, 1, 2, -1


def unsupported_reason(module: nn.Module) -> str | None:
    """None when ``module`` computes a packed pair exactly as its two rows; otherwise why not (one phrase)."""
    config = getattr(module, "config", None)
    if config is None:
        return f"{type(module).__name__} has no Hugging Face config"
    model_type = str(getattr(config, "model_type", "") or "")
    if getattr(config, "vision_config", None) is not None:
        return f"model type {model_type!r} takes images"
    if model_type not in SUPPORTED_MODEL_TYPES:
        return (f"model type {model_type!r} is not one of {', '.join(SUPPORTED_MODEL_TYPES)} (families known to "
                "apply a custom 4-D attention mask as given)")
    impl = str(getattr(config, "_attn_implementation", "") or "eager")
    if impl not in SUPPORTED_ATTENTION:
        return f"attention implementation {impl!r} does not take a dense 4-D mask (sdpa and eager do)"
    layer_types = getattr(config, "layer_types", None) or []
    if any(t != "full_attention" for t in layer_types):
        return "the model has sliding-window or other non-full attention layers"
    if model_type == "mistral" and getattr(config, "sliding_window", None) is not None:
        return "the model has a sliding attention window"
    return None


def _layout_problem(prompt_mask: torch.Tensor, response_mask: torch.Tensor) -> str | None:
    """None for left-padded prompts and right-padded responses, else what is wrong."""
    if prompt_mask.shape[1] and bool((prompt_mask[:, 1:] < prompt_mask[:, :-1]).any()):
        return "shared-prompt packing needs left-padded prompts (a prompt row has padding after a token)"
    if response_mask.shape[1] and bool((response_mask[:, 1:] > response_mask[:, :-1]).any()):
        return "shared-prompt packing needs right-padded responses (a response row has a token after padding)"
    return None


def _check_layout(prompt_mask: torch.Tensor, response_mask: torch.Tensor) -> None:
    problem = _layout_problem(prompt_mask, response_mask)
    if problem:
        raise ValueError(problem)


def block_attention_mask(segments: torch.Tensor) -> torch.Tensor:
    """(P, 1, W, W) bool: query t may attend to key s <= t when s is a prompt token or in t's own segment;
    padding columns attend only to themselves (no query row is empty) and are seen by nobody."""
    width = segments.shape[1]
    causal = torch.ones(width, width, dtype=torch.bool, device=segments.device).tril()
    q, k = segments.unsqueeze(2), segments.unsqueeze(1)
    allowed = causal & (k != PAD) & (q != PAD) & ((k == PROMPT) | (k == q))
    allowed |= torch.eye(width, dtype=torch.bool, device=segments.device) & (q == PAD)
    return allowed.unsqueeze(1)


def pack_pairs(micro) -> "PackedGroups":
    """Pack an interleaved pair micro-batch (``input_ids``, ``attention_mask``, ``responses``: rows ``2i`` and
    ``2i + 1`` are the chosen and rejected responses to one prompt) into one row per pair (per run of pairs with
    the same prompt): :func:`pack_groups` after checking that the rows are such pairs. Segment ``CHOSEN`` is the
    chosen response, ``REJECTED`` the rejected one."""
    input_ids, attention_mask, responses = micro["input_ids"], micro["attention_mask"], micro["responses"]
    rows, seqlen = input_ids.shape
    if rows % 2:
        raise ValueError(f"shared-prompt packing needs interleaved pairs (an even number of rows), got {rows}")
    plen = seqlen - responses.shape[1]
    prompt_mask = attention_mask[:, :plen].bool()
    _check_layout(prompt_mask, attention_mask[:, plen:].bool())
    prompt_c, prompt_r = input_ids[0::2, :plen], input_ids[1::2, :plen]
    if not torch.equal(prompt_mask[0::2], prompt_mask[1::2]) or bool(
            ((prompt_c != prompt_r) & prompt_mask[0::2]).any()):
        raise ValueError("shared-prompt packing: rows 2i and 2i+1 must be the chosen and rejected responses to the "
                         "same prompt")
    return pack_groups(micro)


def _mask_for(module: nn.Module, allowed: torch.Tensor) -> torch.Tensor:
    """The 4-D mask in the form the model's attention applies: bool for sdpa, additive for eager."""
    impl = str(getattr(getattr(module, "config", None), "_attn_implementation", "") or "eager")
    if impl in ("sdpa", "verl_varlen"):
        return allowed
    dtype = module.get_input_embeddings().weight.dtype
    dtype = dtype if dtype.is_floating_point else torch.float32
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill(~allowed,
                                                                                      torch.finfo(dtype).min)


def forward_shared_prompt_log_probs(module: nn.Module, micro, temperature: float = 1.0,
                                    calculate_entropy: bool = False, entropy_grad: bool = True):
    """``(entropy, log_probs)`` (2P, R) of an interleaved pair micro-batch, computed on packed rows; the same
    values as ``hf_forward.forward_log_probs`` on the two-row layout (0 on padding response columns)."""
    present = [k for k in MM_KEYS if k in micro.keys()]
    if present:
        raise ValueError(f"shared-prompt packing is for text pairs; the micro-batch carries {present}")
    return _packed_forward(module, micro, pack_pairs(micro), temperature, calculate_entropy, entropy_grad)


# ---------------------------------------------------------------------------------------------- groups of n
@dataclass
class PackedGroups:
    """A micro-batch of ``B`` rows packed into ``G`` rows, one per run of rows sharing a prompt.

    ``input_ids``/``position_ids``/``segments`` are (G, W) (segment ``k + 1`` is the run's k-th response);
    ``attention_mask`` (G, 1, W, W) as in :func:`block_attention_mask`; ``first`` the column of the last prompt
    token (the same in every row); ``row_group`` (B,) the packed row of each input row; ``src`` (B, R) the column,
    counted from ``first``, whose logits predict each response token; ``valid`` (B, R) the real response tokens.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    segments: torch.Tensor
    attention_mask: torch.Tensor
    first: int
    row_group: torch.Tensor
    src: torch.Tensor
    valid: torch.Tensor

    @property
    def width(self) -> int:
        return self.input_ids.shape[1]


def prompt_runs(input_ids: torch.Tensor, prompt_mask: torch.Tensor) -> torch.Tensor:
    """(B,) run index of each row: consecutive rows with the same prompt tokens (and padding) share a run."""
    rows = input_ids.shape[0]
    same = torch.zeros(rows, dtype=torch.bool, device=input_ids.device)
    if rows > 1:
        mask_same = (prompt_mask[1:] == prompt_mask[:-1]).all(dim=1)
        ids_same = ((input_ids[1:] == input_ids[:-1]) | ~prompt_mask[1:]).all(dim=1)
        same[1:] = mask_same & ids_same
    return torch.cumsum((~same).long(), dim=0) - 1


def pack_groups(micro, check: bool = True) -> PackedGroups:
    """Pack a micro-batch (``input_ids``, ``attention_mask``: left-padded prompt + right-padded response;
    ``responses``) into one row per run of rows that share a prompt (see :func:`prompt_runs`). ``check=False``:
    the caller has already checked the padding layout."""
    input_ids, attention_mask, responses = micro["input_ids"], micro["attention_mask"], micro["responses"]
    rows, seqlen = input_ids.shape
    resp_len = responses.shape[1]
    plen = seqlen - resp_len
    mask = attention_mask.bool()
    prompt_mask, response_mask = mask[:, :plen], mask[:, plen:]
    if check:
        _check_layout(prompt_mask, response_mask)
    device = input_ids.device
    group = prompt_runs(input_ids[:, :plen], prompt_mask)
    groups = int(group[-1]) + 1 if rows else 0
    starts = torch.nonzero(torch.cat([torch.ones(1, dtype=torch.bool, device=device), group[1:] != group[:-1]]),
                           as_tuple=False).flatten() if rows else group
    p = prompt_mask[starts].sum(1)
    r = response_mask.sum(1)
    ends = torch.cumsum(r, 0)
    offset = ends - r - (ends - r)[starts][group]  # where each response starts within its run's response region
    rank = torch.arange(rows, device=device) - starts[group]
    total = torch.zeros(groups, dtype=r.dtype, device=device).index_add_(0, group, r)
    pmax = max(int(p.max()) if groups else 0, 1)
    width = pmax + (int(total.max()) if groups else 0)

    full = width + 1  # one scratch column at the end takes the padding response tokens, cut off below
    ids = torch.zeros(groups, full, dtype=input_ids.dtype, device=device)
    seg = torch.full_like(ids, PAD)
    pos = torch.zeros_like(ids)
    take = min(pmax, plen)
    ids[:, pmax - take:pmax] = input_ids[starts, plen - take:plen]
    seg[:, pmax - take:pmax] = torch.where(prompt_mask[starts, plen - take:], PROMPT, PAD)
    cols = torch.arange(pmax, device=device)
    pos[:, :pmax] = (cols.unsqueeze(0) - (pmax - p).unsqueeze(1)).clamp(min=0)

    j = torch.arange(resp_len, device=device).unsqueeze(0)
    valid = j < r.unsqueeze(1)
    col = torch.where(valid, pmax + offset.unsqueeze(1) + j, full - 1)
    flat = (group.unsqueeze(1) * full + col).flatten()
    ids.view(-1)[flat] = responses.flatten()
    seg.view(-1)[flat] = torch.where(valid, (rank + 1).unsqueeze(1).expand_as(col), PAD).flatten().to(seg.dtype)
    pos.view(-1)[flat] = (p[group].unsqueeze(1) + j).flatten().to(pos.dtype)
    ids, seg, pos = ids[:, :width], seg[:, :width], pos[:, :width]
    pos = torch.where(seg == PAD, 0, pos)

    last = pmax - 1  # the logits at the last prompt column predict every response's first token
    src = torch.where(j == 0, 0, offset.unsqueeze(1) + j)
    return PackedGroups(input_ids=ids, position_ids=pos, segments=seg, attention_mask=block_attention_mask(seg),
                        first=last, row_group=group, src=src.clamp(max=width - last - 1), valid=valid)


def _cost(rows: int, width: int, hidden: int) -> float:
    """Relative forward cost of ``rows`` x ``width`` tokens: the linear layers (~12 d^2 per token) plus
    attention over the row (~2 d x width per token)."""
    return rows * width * (1.0 + width / (6.0 * max(hidden, 1)))


def _packed_shape(micro) -> tuple[int, int]:
    """(rows, width) that :func:`pack_groups` would build, from the row counts alone (nothing is packed)."""
    input_ids, mask = micro["input_ids"], micro["attention_mask"].bool()
    plen = input_ids.shape[1] - micro["responses"].shape[1]
    if input_ids.shape[0] == 0:
        return 0, 0
    prompt_mask = mask[:, :plen]
    group = prompt_runs(input_ids[:, :plen], prompt_mask)
    groups = int(group[-1]) + 1
    total = torch.zeros(groups, dtype=torch.long, device=group.device).index_add_(0, group, mask[:, plen:].sum(1))
    return groups, max(int(prompt_mask.sum(1).max()), 1) + int(total.max())


def grouping_pays(module: nn.Module, micro, margin: float = 0.9) -> bool:
    """Whether packing ``micro`` (:func:`pack_groups`) costs less than ``margin`` x its plain rows (trimmed to
    their valid columns), decided from the row counts before anything is packed."""
    mask = micro["attention_mask"]
    rows = mask.shape[0]
    groups, width = _packed_shape(micro)
    if groups == rows:  # every run has one row: nothing is shared
        return False
    cols = torch.nonzero(mask.any(dim=0), as_tuple=False).flatten()
    plain_width = int(cols[-1] - cols[0]) + 1 if cols.numel() else 0
    hidden = int(getattr(getattr(module, "config", None), "hidden_size", 0) or 0)
    return _cost(groups, width, hidden) < margin * _cost(rows, plain_width, hidden)


def _standard_layout(micro) -> bool:
    """Left-padded prompts, right-padded responses and positions counting the row's tokens from 0: the layout
    the packed rows reproduce (anything else is computed unpacked)."""
    mask = micro["attention_mask"].bool()
    plen = mask.shape[1] - micro["responses"].shape[1]
    if _layout_problem(mask[:, :plen], mask[:, plen:]) is not None:
        return False
    position_ids = micro["position_ids"]
    if position_ids.dim() != 2:
        return False
    expected = (mask.long().cumsum(1) - 1).clamp(min=0)
    return bool(((position_ids == expected) | ~mask).all())


def forward_grouped_log_probs(module: nn.Module, micro, temperature: float = 1.0, calculate_entropy: bool = False,
                              entropy_grad: bool = True):
    """``(entropy, log_probs)`` (B, R) of a micro-batch computed on rows packed by :func:`pack_groups` (0 on
    padding response columns), or None when packing would not save compute (:func:`grouping_pays`)."""
    if any(k in micro.keys() for k in MM_KEYS) or not _standard_layout(micro):
        return None
    if not grouping_pays(module, micro):
        return None
    return _packed_forward(module, micro, pack_groups(micro, check=False), temperature, calculate_entropy,
                           entropy_grad)


def forward_grouped_values(module: nn.Module, micro) -> torch.Tensor | None:
    """A value model's ``values`` (B, R) for the states preceding each response token, computed on rows packed by
    :func:`pack_groups` (0 on padding response columns), or None when packing would not save compute."""
    if any(k in micro.keys() for k in MM_KEYS) or not _standard_layout(micro) or not grouping_pays(module, micro):
        return None
    packed = pack_groups(micro, check=False)
    values = token_values(module(input_ids=packed.input_ids, attention_mask=_mask_for(module, packed.attention_mask),
                                 position_ids=packed.position_ids, use_cache=False))
    picked = values[:, packed.first:][packed.row_group.unsqueeze(1), packed.src]  # (B, R)
    return torch.where(packed.valid, picked, 0.0).float()


def _packed_forward(module: nn.Module, micro, packed: PackedGroups, temperature: float, calculate_entropy: bool,
                    entropy_grad: bool):
    """``(entropy, log_probs)`` (B, R) of the micro-batch's rows from one forward over its packed rows."""
    tail = packed.width - packed.first
    kwargs = {"logits_to_keep": tail} if accepts_logits_to_keep(module) else {}
    logits = module(input_ids=packed.input_ids, attention_mask=_mask_for(module, packed.attention_mask),
                    position_ids=packed.position_ids, use_cache=False, **kwargs).logits
    logits = logits[:, -tail:] / temperature
    picked = logits[packed.row_group.unsqueeze(1), packed.src]  # (B, R, V)
    log_probs = torch.where(packed.valid, logprobs_from_logits(picked, micro["responses"]), 0.0)
    entropy = None
    if calculate_entropy:
        e = entropy_for_loss(picked, entropy_grad)
        entropy = torch.where(packed.valid, e, 0.0)
    return entropy, (log_probs if log_probs.dtype == torch.float64 else log_probs.float())
