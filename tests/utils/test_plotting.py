"""Training-curve panels: only what carries information (no never-logged or all-zero KL panel), validation
accuracy drawn from every val-core/<source>/reward/mean@k series, and the PNG written."""

import os

import matplotlib.image as mpimg

from verl.utils.plotting import panel_series, plot_training_curves, plottable_metrics

VAL = "val-core/arithmetic/reward/mean@1"


def _history(ppo_kl=0.0, kl_loss=None):
    rows = [(0, {VAL: 0.25})]
    for s in range(1, 5):
        m = {"critic/score/mean": s / 10, "response_length/mean": 5.0 + s, "actor/entropy": 2.0 - 0.1 * s,
             "actor/ppo_kl": ppo_kl}
        if kl_loss is not None:
            m["actor/kl_loss"] = kl_loss * s
        if s % 2 == 0:
            m[VAL] = 0.25 + s / 100
        rows.append((s, m))
    return rows


def test_zero_kl_is_left_out_and_validation_is_in():
    panels = panel_series(_history(ppo_kl=0.0))
    assert list(panels) == ["mean training score (critic/score/mean)", "validation accuracy",
                            "response length (response_length/mean)", "policy entropy (actor/entropy)"]
    assert panels["validation accuracy"] == {VAL: [(0, 0.25), (2, 0.27), (4, 0.29)]}
    assert panels["mean training score (critic/score/mean)"]["critic/score/mean"][-1] == (4, 0.4)


def test_kl_drawn_when_computed_kl_loss_first():
    panels = panel_series(_history(ppo_kl=0.0, kl_loss=0.01))
    assert list(panels["KL"]) == ["actor/kl_loss"]
    # no KL loss, but several updates per batch make the old->new policy KL non-zero: that one is drawn
    panels = panel_series(_history(ppo_kl=1e-3))
    assert list(panels["KL"]) == ["actor/ppo_kl"]


def test_plottable_metrics_keeps_panel_metrics_and_validation_only():
    kept = plottable_metrics({"critic/score/mean": 0.5, VAL: 0.3, "val-core/gsm8k/reward/mean@4": 0.1,
                              "timing_s/gen": 1.0, "val-aux/arithmetic/reward/std@1": 0.2, "actor/entropy": "x"})
    assert kept == {"critic/score/mean": 0.5, VAL: 0.3, "val-core/gsm8k/reward/mean@4": 0.1}


def test_png_has_one_axes_per_panel(tmp_path):
    path = plot_training_curves(_history(), str(tmp_path / "exp" / "training_curves.png"), title="t")
    assert path and os.path.getsize(path) > 1000
    image = mpimg.imread(path)
    # 4 panels -> a 2x2 grid of 5x3.3-inch panels at 100 dpi
    assert image.shape[:2] == (660, 1000)
    path5 = plot_training_curves(_history(kl_loss=0.01), str(tmp_path / "kl.png"))
    assert mpimg.imread(path5).shape[:2] == (990, 1000)  # 5 panels -> 3 rows
    assert plot_training_curves([], str(tmp_path / "none.png")) is None
    assert plot_training_curves([(1, {"timing_s/gen": 1.0})], str(tmp_path / "none2.png")) is None
