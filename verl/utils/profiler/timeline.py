"""Draw one torch-profiler trace (``prof_rank-<r>.pt.trace.json.gz``) as a picture: a timeline with one row per
nesting level, the way Perfetto shows a thread's slices, for a report or a place without a browser.

    python -m verl.utils.profiler.timeline /tmp/profile/2/actor_update/prof_rank-0.pt.trace.json.gz \
        --out actor_update.png [--depth 6]

Prints the longest named ranges (worker methods, FSDP and optimizer ranges) with their share of the trace.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
from collections import defaultdict

COLORS = {"user_annotation": "#4c72b0", "cpu_op": "#dd8452", "gpu_user_annotation": "#55a868", "kernel": "#c44e52"}


def load_slices(path: str) -> list[dict]:
    """The complete ('X') events of the trace's busiest thread, each with its nesting ``depth`` (0 = outermost)."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        events = json.load(f).get("traceEvents", [])
    by_thread = defaultdict(list)
    for e in events:
        if e.get("ph") == "X" and e.get("cat") != "Trace" and isinstance(e.get("dur"), (int, float)):
            by_thread[(e.get("pid"), e.get("tid"))].append(e)
    if not by_thread:
        raise ValueError(f"{path}: no complete events (ph='X'); is it a torch profiler trace?")
    slices = max(by_thread.values(), key=len)
    slices.sort(key=lambda e: (e["ts"], -e["dur"]))
    stack: list[float] = []  # end times of the open slices
    for e in slices:
        while stack and e["ts"] >= stack[-1]:
            stack.pop()
        e["depth"] = len(stack)
        stack.append(e["ts"] + e["dur"])
    return slices


def draw(slices: list[dict], out: str, depth: int = 6, title: str = "") -> None:
    import matplotlib  # optional heavy dependency: only drawing needs it (load_slices / longest_ranges do not)

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt  # optional heavy dependency (see above), after the backend choice

    t0 = min(e["ts"] for e in slices)
    span_ms = max(e["ts"] + e["dur"] for e in slices) / 1e3 - t0 / 1e3
    fig, ax = plt.subplots(figsize=(14, 0.5 * depth + 1.2))
    for e in slices:
        if e["depth"] >= depth:
            continue
        start, width = (e["ts"] - t0) / 1e3, e["dur"] / 1e3
        y = depth - 1 - e["depth"]
        ax.broken_barh([(start, width)], (y + 0.05, 0.9), facecolors=COLORS.get(e.get("cat"), "#8c8c8c"),
                       edgecolor="white", linewidth=0.2)
        if width > span_ms / 45:  # label the slices wide enough to hold text
            ax.text(start + width / 2, y + 0.5, e["name"][: max(4, int(width / span_ms * 160))], ha="center",
                    va="center", fontsize=7, color="white", clip_on=True)
    ax.set_xlim(0, span_ms)
    ax.set_ylim(0, depth)
    ax.set_yticks([depth - 0.5 - d for d in range(depth)], [f"depth {d}" for d in range(depth)], fontsize=7)
    ax.set_xlabel("ms from the start of the trace")
    ax.set_title(title, fontsize=9, loc="right")
    cats = sorted({e.get("cat") for e in slices if e["depth"] < depth} & set(COLORS))
    ax.legend([plt.Rectangle((0, 0), 1, 1, color=COLORS[c]) for c in cats], cats, fontsize=7, ncol=len(cats),
              loc="lower left", bbox_to_anchor=(0, 1.0), frameon=False)
    fig.tight_layout()
    tmp = out + ".tmp.png"
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    os.replace(tmp, out)


def longest_ranges(slices: list[dict], top: int = 10) -> list[tuple[str, float, int]]:
    """(name, total ms, calls) of the named ranges (``user_annotation``), longest first."""
    total: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    for e in slices:
        if e.get("cat") == "user_annotation":
            total[e["name"]] += e["dur"] / 1e3
            calls[e["name"]] += 1
    return sorted(((n, total[n], calls[n]) for n in total), key=lambda r: -r[1])[:top]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trace", help="a prof_rank-<r>.pt.trace.json(.gz) file")
    parser.add_argument("--out", help="PNG to write (default: the trace's name with .png)")
    parser.add_argument("--depth", type=int, default=6, help="nesting levels to draw (default 6)")
    args = parser.parse_args(argv)
    if not os.path.isfile(args.trace):
        print(f"timeline: {args.trace} is not a file", file=sys.stderr)
        return 2
    if args.depth < 1:
        print(f"timeline: --depth={args.depth}: draw at least one level", file=sys.stderr)
        return 2
    try:
        slices = load_slices(args.trace)
    except (ValueError, json.JSONDecodeError, OSError) as err:
        print(f"timeline: {args.trace}: {err}", file=sys.stderr)
        return 2
    out = args.out or args.trace.removesuffix(".gz").removesuffix(".json") + ".png"
    span = (max(e["ts"] + e["dur"] for e in slices) - min(e["ts"] for e in slices)) / 1e3
    name = "/".join(os.path.abspath(args.trace).split(os.sep)[-3:])  # <step>/<call>/prof_rank-<r>...
    draw(slices, out, args.depth, title=f"{name}  ({len(slices)} slices, {span:.0f} ms)")
    for name, ms, n in longest_ranges(slices):
        print(f"{ms:10.1f} ms  {100 * ms / span:5.1f}%  x{n:<4d} {name}")
    print(f"timeline: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
