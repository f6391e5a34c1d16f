"""Convert a Hugging Face model directory into a Megatron distributed checkpoint (verl's
``scripts/converter_hf_to_mcore.py``, same arguments)::

    python -m verl.models.mcore.converter_hf_to_mcore --hf_model_path <hf dir> --output_path <dir> [--test]

The output is what ``<role>.megatron.use_dist_checkpointing=True`` with ``dist_checkpointing_path=<dir>`` starts
from: one global tensor per weight (:mod:`verl.models.mcore.dist_ckpt`), readable by any tensor / pipeline /
virtual-pipeline layout, so it is written once whatever layout trains. It runs on CPU over gloo: as one process,
or under ``torchrun --nproc_per_node <pp_size>`` with ``--pp_size`` to split the layers over processes. The
weights keep the HF checkpoint's dtype (``torch_dtype`` of its config; fp32 when it names none). ``--test`` reads
the checkpoint back into a fresh model and compares every weight with the HF file.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys

import torch
import torch.distributed as dist
from transformers import AutoConfig

from verl.models.mcore.convert import HFWeights
from verl.models.mcore.dist_ckpt import load_dist_weights, save_dist_weights
from verl.models.mcore.model import build_gpt_model, iter_hf_params, load_hf_weights
from verl.models.mcore.settings import MEGATRON_DTYPES, check_megatron_settings
from verl.utils.megatron.parallel import init_model_parallel

__all__ = ["convert", "main"]


def _args(argv=None):
    p = argparse.ArgumentParser(prog="python -m verl.models.mcore.converter_hf_to_mcore",
                                description="HF model -> Megatron distributed checkpoint (dist_checkpointing_path)")
    p.add_argument("--hf_model_path", required=True, help="the Hugging Face model directory (safetensors)")
    p.add_argument("--output_path", required=True, help="the directory to write the Megatron checkpoint to")
    p.add_argument("--pp_size", type=int, default=1, help="pipeline stages to split the conversion over "
                                                           "(processes under torchrun; the output is the same)")
    p.add_argument("--ep_size", type=int, default=1, help="expert parallel size (verl's flag; only 1 here)")
    p.add_argument("--use_cpu_initialization", action="store_true", help="accepted: this converter always builds "
                                                                          "the model on the CPU")
    p.add_argument("--test", action="store_true", help="read the checkpoint back and compare it with the HF weights")
    p.add_argument("--trust_remote_code", action="store_true", help="trust the model's remote code (config)")
    return p.parse_args(argv)


def _init_process_group() -> bool:
    """Join torchrun's group, or start a one-process gloo group. Returns whether this function started it."""
    if dist.is_initialized():
        return False
    if "RANK" not in os.environ:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    dist.init_process_group("gloo")
    return True


def _hf_dtype(hf_config) -> torch.dtype:
    dtype = getattr(hf_config, "torch_dtype", None) or getattr(hf_config, "dtype", None)
    if isinstance(dtype, torch.dtype):
        return dtype
    return MEGATRON_DTYPES.get(str(dtype).replace("torch.", ""), torch.float32)


def convert(hf_model_path: str, output_path: str, pp_size: int = 1, trust_remote_code: bool = False,
            test: bool = False) -> None:
    """Write ``hf_model_path``'s weights as a distributed checkpoint at ``output_path`` (collective: every process
    of the default group takes part; ``pp_size`` of them hold a pipeline stage each)."""
    hf_config = AutoConfig.from_pretrained(hf_model_path, trust_remote_code=trust_remote_code)
    check_megatron_settings({"pipeline_model_parallel_size": pp_size}, hf_config, "converter (--pp_size)",
                            on_cpu=True)
    if dist.get_world_size() != pp_size:
        raise ValueError(f"--pp_size={pp_size} needs {pp_size} processes (torchrun --nproc_per_node {pp_size}); "
                         f"this run has {dist.get_world_size()}")
    init_model_parallel(1, pp_size, seed=42, owner="converter")
    dtype = _hf_dtype(hf_config)
    model = build_gpt_model(hf_config, value_head=False, sequence_parallel=False, dtype=dtype)
    load_hf_weights(model, hf_model_path, hf_config, value_head=False)
    save_dist_weights(model, output_path)
    dist.barrier()
    if test:
        fresh = build_gpt_model(hf_config, value_head=False, sequence_parallel=False, dtype=dtype)
        load_dist_weights(fresh, output_path, hf_config, value_head=False, key="--output_path")
        weights = HFWeights(hf_model_path)
        for name, tensor in iter_hf_params(fresh, hf_config, value_head=False):
            if name in weights and not torch.equal(tensor, weights.get(name).to(tensor.dtype)):
                raise AssertionError(f"{output_path}: {name} differs from {hf_model_path} after the round trip")
    if dist.get_rank() == 0:
        print(f"wrote the Megatron distributed checkpoint of {hf_model_path} to {output_path}"
              + (" (read back: every weight equals the HF file)" if test else ""))


def main(argv=None) -> int:
    args = _args(argv)
    if args.ep_size != 1:
        print("--ep_size: the converter writes dense models (Qwen2, Llama) only; use --ep_size 1", file=sys.stderr)
        return 2
    started = _init_process_group()
    try:
        convert(args.hf_model_path, args.output_path, args.pp_size, args.trust_remote_code, args.test)
    finally:
        if started:
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
