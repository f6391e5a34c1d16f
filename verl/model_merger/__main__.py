"""``python -m verl.model_merger {merge,test} --backend fsdp --local_dir DIR (--target_dir OUT | --test_hf_dir REF)``."""

import sys

from verl.model_merger.base_model_merger import generate_config_from_args, parse_args


def main(argv=None) -> int:
    args = parse_args(argv)
    config = generate_config_from_args(args)
    if config.backend != "fsdp":
        raise SystemExit(f"--backend {config.backend!r} is not supported here; use --backend fsdp")
    from verl.model_merger.fsdp_model_merger import FSDPModelMerger

    try:
        merger = FSDPModelMerger(config)
        merger.merge_and_save() if config.operation == "merge" else merger.test()
    except (FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
