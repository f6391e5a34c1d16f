"""Turn a sharded training checkpoint into a Hugging Face model directory.

    python -m verl.model_merger merge --backend fsdp --local_dir ckpts/global_step_10/actor --target_dir out/
    python -m verl.model_merger test  --backend fsdp --local_dir ckpts/global_step_10/actor --test_hf_dir ref/
"""

from verl.model_merger.base_model_merger import BaseModelMerger, ModelMergerConfig, generate_config_from_args, parse_args
from verl.model_merger.fsdp_model_merger import FSDPModelMerger, load_fsdp_checkpoint

__all__ = ["BaseModelMerger", "ModelMergerConfig", "FSDPModelMerger", "generate_config_from_args", "parse_args",
           "load_fsdp_checkpoint"]
