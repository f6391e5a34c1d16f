"""Megatron distributed checkpoints of model weights: the start of ``<role>.megatron.use_dist_checkpointing``.

A distributed checkpoint (megatron-core ``dist_checkpointing``, ``torch_dist`` format: torch.distributed.checkpoint
underneath, which runs on gloo/CPU) stores each weight once as a *global* tensor under megatron's key (layers
stacked under ``decoder.layers.*``, the transformer-engine names megatron's local layers map to), so any
tensor / pipeline / virtual-pipeline layout reads it: each rank loads only its own slices.

- :func:`save_dist_weights` writes a model's weights that way (collective): what
  ``python -m verl.models.mcore.converter_hf_to_mcore`` does for an HF model, as verl's
  ``scripts/converter_hf_to_mcore.py`` does.
- :func:`load_dist_weights` fills a freshly built model from such a directory (collective), as verl's
  ``load_mcore_dist_weights``: ``prefix`` (``dist_checkpointing_prefix``) is prepended to every key (NeMo writes
  ``module.``); a critic's value head is not read (it starts at zero, like a value head missing from HF weights);
  a tied output layer split from the embedding over pipeline stages reads the embedding's tensor when the
  checkpoint was written without a separate ``output_layer.weight`` (a PP=1 tied checkpoint).

The Megatron engine's own training checkpoints (``global_step_N/<role>/dist_ckpt``) are in this format too.
"""

from __future__ import annotations

import os

import torch

from verl.models.mcore.model import ValueHead, as_chunks, tag_tensor_parallel

__all__ = ["save_dist_weights", "load_dist_weights", "is_dist_checkpoint"]

_EMBEDDING = "embedding.word_embeddings.weight"
_OUTPUT = "output_layer.weight"


def is_dist_checkpoint(path: str) -> bool:
    """Whether ``path`` is a megatron-core distributed checkpoint directory (it has megatron's metadata.json)."""
    return os.path.isfile(os.path.join(path, "metadata.json"))


def _weights_state(chunks: list, prefix: str = "") -> dict:
    # the keys of this nesting are this process's own; what the checkpoint stores is each sharded tensor's key
    state = {}
    for v, chunk in enumerate(chunks):
        for name, sh in chunk.sharded_state_dict(prefix=prefix).items():
            state[f"{v}/{name}"] = sh
    return state


def save_dist_weights(model, path: str) -> None:
    """Write the weights of ``model`` (a ``GPTModel`` or this rank's model chunks) as a distributed checkpoint at
    ``path`` (collective over all ranks of the model-parallel grid)."""
    # optional heavy dependency: megatron-core (~10 s to import) is needed only with strategy=megatron
    from megatron.core import dist_checkpointing

    os.makedirs(path, exist_ok=True)
    dist_checkpointing.save(_weights_state(as_chunks(model)), path)


@torch.no_grad()
def load_dist_weights(model, path: str, hf_config, value_head: bool, prefix: str = "",
                      key: str = "megatron.dist_checkpointing_path") -> None:
    """Fill ``model`` (a ``GPTModel`` or this rank's model chunks) from the distributed checkpoint at ``path``
    (collective); ``key`` names the setting in errors."""
    # optional heavy dependency: megatron-core (~10 s to import) is needed only with strategy=megatron
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.mapping import ShardedObject, ShardedTensor
    from megatron.core.dist_checkpointing.serialization import StrictHandling

    if not is_dist_checkpoint(path):
        raise FileNotFoundError(f"{key}={path!r} is not a Megatron distributed checkpoint (no metadata.json); make "
                                "one from HF weights with `python -m verl.models.mcore.converter_hf_to_mcore "
                                "--hf_model_path <hf dir> --output_path <dir>`")
    chunks = as_chunks(model)
    stored = set(dist_checkpointing.load_tensors_metadata(path))
    state = _weights_state(chunks, prefix)
    for name in list(state):
        sh = state[name]
        local = name.split("/", 1)[1]
        if isinstance(sh, ShardedObject) or (value_head and local.startswith(prefix + "output_layer.")):
            # weights only: no layer's extra state (megatron's local layers keep none; transformer-engine ones
            # keep fp8 metadata), and no critic value head (a causal LM's checkpoint has none)
            del state[name]
        elif local == prefix + _OUTPUT and sh.key not in stored and prefix + _EMBEDDING in stored:
            sh.key = prefix + _EMBEDDING  # a tied model's last-stage copy of the embedding: a replica of it
            sh.replica_id = (1, *sh.replica_id[1:]) if isinstance(sh.replica_id, tuple) else 1
    missing = sorted({sh.key for sh in state.values() if isinstance(sh, ShardedTensor) and sh.key not in stored})
    if missing:
        raise ValueError(f"{key}={path!r} lacks {missing[:4]}{' ...' if len(missing) > 4 else ''}: was it written "
                         f"for this model ({getattr(hf_config, 'architectures', None)}, "
                         f"{hf_config.num_hidden_layers} layers)? (dist_checkpointing_prefix={prefix!r})")
    loaded = dist_checkpointing.load(state, path, strict=StrictHandling.ASSUME_OK_UNEXPECTED)
    for v, chunk in enumerate(chunks):
        mine = {name.split("/", 1)[1][len(prefix):]: t for name, t in loaded.items() if name.startswith(f"{v}/")}
        chunk.load_state_dict(mine, strict=False)
        if value_head and isinstance(getattr(chunk, "output_layer", None), ValueHead):
            for p in chunk.output_layer.parameters():
                p.zero_()
    tag_tensor_parallel(chunks, hf_config, value_head)
