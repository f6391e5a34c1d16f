"""``python -m verl.model_merger {merge,test} --backend {fsdp,megatron} --local_dir DIR (--target_dir OUT |
--test_hf_dir REF)``."""

import sys

from verl.model_merger.base_model_merger import generate_config_from_args, parse_args
from verl.model_merger.fsdp_model_merger import FSDPModelMerger
from verl.model_merger.megatron_model_merger import MegatronModelMerger


def main(argv=None) -> int:
    args = parse_args(argv)
    config = generate_config_from_args(args)
    try:
        merger_cls = MegatronModelMerger if config.backend == "megatron" else FSDPModelMerger
        merger = merger_cls(config)
        if config.operation == "merge":
            merger.upload(merger.merge_and_save() or config.target_dir)
        else:
            merger.test()
    except (FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
