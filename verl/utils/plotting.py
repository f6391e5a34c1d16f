"""Training curves as one PNG (matplotlib, Agg backend), with only the panels that carry information.

Panels, in order: mean training score, greedy/validation accuracy (every ``val-core/<source>/reward/mean@k``
series), response length, policy entropy, and KL. A panel whose metrics were never logged -- or are zero at
every step, such as ``actor/ppo_kl`` when each batch gets a single on-policy update, or a KL loss that is
switched off -- is left out rather than drawn as a flat line.

``RayPPOTrainer.fit`` calls ``plot_training_curves(history, path)`` at the end of training with
``path = <trainer.default_local_dir>/training_curves.png`` and prints the path; the quickstart draws the same
figure from its metrics file.
"""

from __future__ import annotations

import math
import os
import re
from typing import Iterable

__all__ = ["PLOT_PANELS", "plot_training_curves", "plottable_metrics", "panel_series"]

# panel title -> metric names (KL: the first name with a non-zero series is drawn)
PLOT_PANELS = {
    "mean training score (critic/score/mean)": ["critic/score/mean"],
    "validation accuracy": [],  # every metric matching VAL_PATTERN
    "response length (response_length/mean)": ["response_length/mean"],
    "policy entropy (actor/entropy)": ["actor/entropy"],
    "KL": ["actor/kl_loss", "actor/reward_kl_penalty", "actor/ppo_kl"],
}
VAL_PANEL = "validation accuracy"
VAL_PATTERN = re.compile(r"^val-core/.+/reward/mean@\d+$")
_ZERO = 1e-12


def plottable_metrics(metrics: dict) -> dict:
    """The subset of one step's metrics that some panel can draw, as floats (for a trainer's history)."""
    names = {name for names in PLOT_PANELS.values() for name in names}
    out = {}
    for key, value in metrics.items():
        if key in names or VAL_PATTERN.match(key):
            try:
                out[key] = float(value)
            except (TypeError, ValueError):
                continue
    return out


def _points(history: Iterable[tuple[int, dict]], name: str) -> list[tuple[int, float]]:
    points = []
    for step, metrics in history:
        value = metrics.get(name)
        if value is None:
            continue
        value = float(value)
        if math.isfinite(value):
            points.append((step, value))
    return points


def panel_series(history: list[tuple[int, dict]]) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """``{panel title: {metric name: [(step, value), ...]}}`` for the panels worth drawing, in panel order."""
    panels: dict[str, dict[str, list[tuple[int, float]]]] = {}
    for panel, names in PLOT_PANELS.items():
        if panel == VAL_PANEL:
            val_names = sorted({k for _, m in history for k in m if VAL_PATTERN.match(k)})
            series = {name: _points(history, name) for name in val_names}
            series = {k: v for k, v in series.items() if v}
        else:
            series = {}
            for name in names:
                points = _points(history, name)
                # first name that was logged and is not identically zero (an unused KL term logs zeros)
                if points and any(abs(v) > _ZERO for _, v in points):
                    series = {name: points}
                    break
        if series:
            panels[panel] = series
    return panels


def plot_training_curves(history: list[tuple[int, dict]], path: str, title: str | None = None) -> str | None:
    """Draw the informative panels from ``[(step, metrics), ...]``; returns the path, or None if nothing to draw."""
    history = sorted(history, key=lambda x: x[0])
    panels = panel_series(history)
    if not panels:
        return None
    # optional heavy dependency: matplotlib (~1 s to import) is loaded only when a figure is drawn, and the Agg
    # backend must be chosen before pyplot is imported
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt  # optional heavy dependency (see above), after the backend choice

    cols = 1 if len(panels) == 1 else 2
    rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.3 * rows), squeeze=False)
    for ax, (panel, series) in zip(axes.flat, panels.items()):
        if panel == "KL":
            (name,) = series
            ax.set_title(f"KL ({name})", fontsize=10)
        else:
            ax.set_title(panel, fontsize=10)
        for name, points in series.items():
            xs, ys = zip(*points)
            label = name.split("/")[1] + " " + name.rsplit("/", 1)[1] if panel == VAL_PANEL else None
            ax.plot(xs, ys, marker="o", markersize=3, label=label)
        if panel == VAL_PANEL:
            ax.legend(fontsize=8)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
