"""Write a small Qwen2 model directory with the embedded tokenizer.

python -m verl.utils.embedded.make_model --size tiny --out ~/models/arith-tiny [--seed 0] [--overwrite]
"""

from __future__ import annotations

import argparse
import sys

from verl.utils.embedded.model import MODEL_SIZES, make_model_dir


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="tiny", choices=sorted(MODEL_SIZES))
    parser.add_argument("--out", required=True, help="directory to write (created; written atomically)")
    parser.add_argument("--seed", type=int, default=0, help="weight initialisation seed")
    parser.add_argument("--overwrite", action="store_true", help="replace a different model already at --out")
    args = parser.parse_args(argv)
    try:
        path = make_model_dir(args.out, size=args.size, seed=args.seed, overwrite=args.overwrite)
    except (FileExistsError, ValueError) as err:
        parser.exit(2, f"error: {err}\n")
    print(path)
    return path


if __name__ == "__main__":
    main(sys.argv[1:])
