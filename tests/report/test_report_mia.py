"""The report's membership-inference plot: final values as points with mean ± std error bars."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import fedexp.report.plots as plots
from fedexp.report import find_runs, group_runs, plot_mia


def make_run(root: Path, name: str, algorithm: str, seed: int, status="completed", **metrics):
    """A run dir with the summary.json fields the report reads."""
    (root / name).mkdir(parents=True)
    summary = {
        "status": status,
        "rounds_completed": 1,
        "metrics": {"eval/global/acc": 0.5, **metrics},
        "choices": {"algorithm": algorithm, "dataset": "digits"},
        "config": {"seed": seed, "algorithm": {"_target_": algorithm}},
    }
    (root / name / "summary.json").write_text(json.dumps(summary))


def test_mia_is_drawn_as_points_with_mean_and_std_over_seeds(tmp_path, monkeypatch):
    for name, algorithm, seed, auc in [("0", "fedavg", 0, 0.7), ("1", "fedavg", 1, 0.9)]:
        make_run(tmp_path, name, algorithm, seed, **{"privacy/mia_auc": auc})
    make_run(tmp_path, "2", "waffle", 0, **{"privacy/mia_auc": 0.55})
    make_run(tmp_path, "3", "waffle", 1, status="diverged", **{"privacy/mia_auc": 0.0})
    groups, _ = group_runs(find_runs([tmp_path]))
    figures = []
    monkeypatch.setattr(plots, "_save", lambda plt, fig, path, drawn: figures.append(fig) or drawn)

    assert plot_mia(groups, tmp_path / "mia.png")

    (ax,) = figures[0].axes  # only the metric the runs report
    assert ax.get_ylabel() == "ROC AUC"
    fedavg, waffle = ax.containers  # one point per group, in the group's colour
    points, _caps, (segments,) = fedavg.lines
    assert points.get_linestyle() == "None" and points.get_marker() == "o"  # no line
    # fedavg (0.7 + 0.9) / 2 = 0.8 ± sample std 0.1414; waffle 0.55 from its one completed
    # seed (the diverged one is left out): a point without an error bar
    assert np.asarray(points.get_ydata()) == pytest.approx([0.8], abs=1e-12)
    (low_high,) = [(s[0][1], s[1][1]) for s in segments.get_segments()]
    assert low_high == pytest.approx((0.8 - 0.02**0.5, 0.8 + 0.02**0.5), abs=1e-12)
    assert np.asarray(waffle.lines[0].get_ydata()) == pytest.approx([0.55], abs=1e-12)
    assert waffle.lines[2] == ()  # no bar
    assert points.get_color() != waffle.lines[0].get_color()
    assert [t.get_text() for t in ax.get_xticklabels()] == [
        "algorithm=fedavg",
        "algorithm=waffle",
    ]
    assert ax.lines[-1].get_ydata()[0] == 0.5  # chance


def test_no_mia_metric_no_plot(tmp_path):
    make_run(tmp_path, "0", "fedavg", 0)
    groups, _ = group_runs(find_runs([tmp_path]))
    assert not plot_mia(groups, tmp_path / "mia.png")
    assert not (tmp_path / "mia.png").exists()
