"""Training curves as one PNG: score, response length, KL and entropy by step (matplotlib, Agg backend).

``RayPPOTrainer.fit`` calls ``plot_training_curves(history, path)`` at the end of training with
``path = <trainer.default_local_dir>/training_curves.png`` and prints the path.
"""

from __future__ import annotations

import os
from typing import Iterable

__all__ = ["PLOT_PANELS", "plot_training_curves"]

# panel title -> metric names (the first one present is drawn)
PLOT_PANELS = {
    "score (critic/score/mean)": ["critic/score/mean"],
    "response length (response_length/mean)": ["response_length/mean"],
    "KL": ["actor/ppo_kl", "actor/kl_loss", "actor/reward_kl_penalty"],
    "entropy (actor/entropy)": ["actor/entropy"],
}


def _series(history: Iterable[tuple[int, dict]], names: list[str]):
    for name in names:
        points = [(step, float(m[name])) for step, m in history if name in m and m[name] is not None]
        if points:
            return name, points
    return None, []


def plot_training_curves(history: list[tuple[int, dict]], path: str, title: str | None = None) -> str | None:
    """Draw the panels of ``PLOT_PANELS`` from ``[(step, metrics), ...]``; returns the path, or None if empty."""
    history = sorted(history, key=lambda x: x[0])
    if not history:
        return None
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(10, 7))
    for ax, (panel, names) in zip(axes.flat, PLOT_PANELS.items()):
        name, points = _series(history, names)
        ax.set_title(panel if name is None or name in panel else f"{panel}: {name}", fontsize=10)
        ax.set_xlabel("step")
        if points:
            xs, ys = zip(*points)
            ax.plot(xs, ys, marker="o", markersize=3)
        else:
            ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes, color="gray")
        ax.grid(alpha=0.3)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
