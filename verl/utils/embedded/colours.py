"""A tiny visual task for vision-language RL: name the colour of the square in the picture.

Each image is a 56x56 grey canvas with one filled square of a random size and place in one of ``COLOURS``;
the prompt is ``"<image>What colour is the square?"`` and the answer is the colour's name. Rows follow verl's
multimodal parquet schema (``images`` holds ``{"bytes": <PNG>}`` dicts, as ``datasets`` stores images):

    {"data_source": "embedded/colours", "prompt": [{"role": "user", "content": "<image>What colour is the square?"}],
     "images": [{"bytes": b"\\x89PNG..."}], "ability": "vision",
     "reward_model": {"style": "rule", "ground_truth": "red"}, "extra_info": {"split": "train", "index": 0}}

The rule reward (:func:`compute_score`) gives 1 for an answer that starts with the right colour, 0.5 when the
right colour appears later, 0.1 for naming a wrong colour (the answer has the right form), and otherwise 0.05
times the share of the answer's characters that occur in the right colour's name: a signal that already depends
on the image for a randomly initialised model, whose answers name no colour at all.

    python -m verl.utils.embedded.colours --local_dir ~/data/colours --train_size 256 --test_size 32
"""

from __future__ import annotations

import argparse
import io
import os
import random
import sys

import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image, ImageDraw

__all__ = ["DATA_SOURCE", "COLOURS", "QUESTION", "make_image", "make_rl_rows", "compute_score", "write_parquet"]

DATA_SOURCE = "embedded/colours"
ABILITY = "vision"
QUESTION = "<image>What colour is the square?"
COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 30, 30), "green": (30, 180, 40), "blue": (30, 60, 220), "yellow": (235, 215, 30),
}
BACKGROUND = (128, 128, 128)
IMAGE_SIZE = 56


def make_image(colour: str, rng: random.Random, size: int = IMAGE_SIZE) -> Image.Image:
    """A ``size`` x ``size`` grey RGB image with one filled square of ``colour`` (side 40-80% of the image)."""
    if colour not in COLOURS:
        raise ValueError(f"unknown colour {colour!r}; choose one of {sorted(COLOURS)}")
    img = Image.new("RGB", (size, size), BACKGROUND)
    side = rng.randint(int(0.4 * size), int(0.8 * size))
    x, y = rng.randint(0, size - side), rng.randint(0, size - side)
    ImageDraw.Draw(img).rectangle([x, y, x + side - 1, y + side - 1], fill=COLOURS[colour])
    return img


def _png_bytes(img: Image.Image) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def make_rl_rows(n: int, split: str = "train", seed: int = 0, size: int = IMAGE_SIZE) -> list[dict]:
    """``n`` rows in verl's multimodal schema; colours cycle so every colour is equally frequent."""
    rng = random.Random(f"{split}-{seed}")
    names = sorted(COLOURS)
    rows = []
    for index in range(n):
        colour = names[index % len(names)] if n >= len(names) else rng.choice(names)
        rows.append({
            "data_source": DATA_SOURCE,
            "prompt": [{"role": "user", "content": QUESTION}],
            "images": [{"bytes": _png_bytes(make_image(colour, rng, size))}],
            "ability": ABILITY,
            "reward_model": {"style": "rule", "ground_truth": colour},
            "extra_info": {"split": split, "index": index},
        })
    rng.shuffle(rows)
    return rows


def compute_score(data_source, solution_str: str, ground_truth: str, extra_info=None) -> float:
    """The rule reward (module docstring); takes the ``custom_reward_function`` arguments."""
    answer = solution_str.strip().lower()
    truth = str(ground_truth).strip().lower()
    if answer.startswith(truth):
        return 1.0
    if truth in answer:
        return 0.5
    if any(name in answer for name in COLOURS):
        return 0.1
    return 0.05 * sum(ch in truth for ch in answer) / len(answer) if answer else 0.0


def write_parquet(rows: list[dict], path: str) -> str:
    """Write rows to ``path`` (images as a list of ``{bytes}`` structs)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def main(argv: list[str] | None = None) -> list[str]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--local_dir", required=True, help="directory for train.parquet and test.parquet")
    parser.add_argument("--train_size", type=int, default=256)
    parser.add_argument("--test_size", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.train_size <= 0 or args.test_size <= 0:
        parser.exit(2, "error: --train_size and --test_size must be positive\n")
    out = os.path.expanduser(args.local_dir)
    paths = [write_parquet(make_rl_rows(args.train_size, "train", args.seed), os.path.join(out, "train.parquet")),
             write_parquet(make_rl_rows(args.test_size, "test", args.seed), os.path.join(out, "test.parquet"))]
    for path in paths:
        print(path)
    return paths


if __name__ == "__main__":
    main(sys.argv[1:])
