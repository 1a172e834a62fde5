"""The report at a glance: colours, short labels, legends outside the axes, the search plot."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib.colors as mcolors
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from omegaconf import OmegaConf

import fedexp.report.plots as plots
from fedexp.report import find_runs, group_runs, main

MU = "tag(log, interval(0.001, 1.0))"


def make_run(root: Path, name: str, mu: float, seed: int, accs, objective=None, search=False):
    run = root / name
    run.mkdir(parents=True)
    rows = [
        {"round": t, "eval/global/acc": a, "comm/up_bits_total": 8e6 * t}
        for t, a in enumerate(accs, start=1)
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    choices = {"algorithm": "fedprox", "hparams_search": "fedprox_mu" if search else None}
    summary = {
        "status": "completed",
        "rounds_completed": len(accs),
        "metrics": rows[-1],
        "client_acc": {"global": [accs[-1] - 0.1, accs[-1] + 0.1]},
        "choices": choices,
        "config": {"seed": seed, "algorithm": {"_target_": "fedprox", "mu": mu}},
        "objective": {"name": "eval/val/global/acc", "value": objective},
    }
    (run / "summary.json").write_text(json.dumps(summary))
    if search:
        sweeper = {"params": {"algorithm.mu": MU}, "direction": "maximize"}
        (run / ".hydra").mkdir()
        OmegaConf.save({"hydra": {"sweeper": sweeper}}, run / ".hydra" / "hydra.yaml")


def test_labels_are_short_unless_two_groups_would_clash(tmp_path):
    make_run(tmp_path, "0", 0.018738174228603841, 0, [0.5])
    make_run(tmp_path, "1", 0.1, 0, [0.5])
    groups, _ = group_runs(find_runs([tmp_path]))
    assert list(groups) == ["algorithm.mu=0.0187", "algorithm.mu=0.1"]  # in order of the value
    make_run(tmp_path, "2", 0.018741, 0, [0.5])
    groups, _ = group_runs(find_runs([tmp_path]))
    # 6 digits tell them apart
    assert list(groups) == ["algorithm.mu=0.018738", "algorithm.mu=0.018741", "algorithm.mu=0.1"]


def test_a_group_has_one_colour_in_every_figure_and_legends_sit_outside(tmp_path, monkeypatch):
    for i, (mu, seed, accs) in enumerate(
        [(0.01, 0, [0.2, 0.5]), (0.01, 1, [0.4, 0.7]), (1.0, 0, [0.3, 0.6]), (1.0, 1, [0.3, 0.8])]
    ):
        make_run(tmp_path / "runs", str(i), mu, seed, accs)
    figures = {}
    real_save = plots._save
    monkeypatch.setattr(
        plots,
        "_save",
        lambda plt, fig, path, drawn: (
            figures.setdefault(path.stem, fig) and real_save(plt, fig, path, drawn)
        ),
    )
    assert main([str(tmp_path / "runs"), "--out", str(tmp_path / "out")]) == 0
    expected = plots.palette(["algorithm.mu=0.01", "algorithm.mu=1"])
    (ax,) = figures["acc_vs_round"].axes
    lines = {line.get_label(): line.get_color() for line in ax.get_lines()}
    assert {k: mcolors.to_rgba(v) for k, v in lines.items()} == expected
    (ax,) = figures["final_acc"].axes
    points = [mcolors.to_rgba(c.lines[0].get_color()) for c in ax.containers]
    assert points == [expected["algorithm.mu=0.01"], expected["algorithm.mu=1"]]
    (ax,) = figures["client_acc_box"].axes
    boxes = [p.get_facecolor()[:3] for p in ax.patches]
    assert boxes == [expected["algorithm.mu=0.01"][:3], expected["algorithm.mu=1"][:3]]
    # the legend is right of the axes, not over the curves, whatever the figure
    for name in ("acc_vs_round", "acc_vs_comm"):
        fig = figures[name]
        canvas = FigureCanvasAgg(fig)
        canvas.draw()  # the constrained layout places the panels and the legend
        renderer = canvas.get_renderer()
        (legend,) = fig.legends
        box = legend.get_window_extent(renderer)
        assert all(box.x0 >= ax.get_window_extent(renderer).x1 for ax in fig.axes), name


def test_long_group_labels_keep_the_legend_outside_and_warn_nothing(tmp_path, recwarn):
    # a preset sweep's labels can be long: the layout must still fit them beside the panels
    long = "x" * 90
    for i, mu in enumerate([0.01, 1.0]):
        make_run(tmp_path / "runs", str(i), mu, 0, [0.2, 0.5])
    runs = find_runs([tmp_path / "runs"])
    groups, _ = group_runs(runs)
    groups = {f"{name} {long}": members for name, members in groups.items()}
    from fedexp.report.plots import plot_final_accuracy, plot_vs_round

    assert plot_vs_round(groups, tmp_path / "a.png", {"eval/global/acc": "g"}, "test accuracy")
    assert plot_final_accuracy(groups, tmp_path / "b.png")
    assert not [w for w in recwarn if "layout" in str(w.message).lower()]


def test_a_search_plots_the_objective_against_each_parameter_with_the_best_marked(
    tmp_path, monkeypatch
):
    for i, (mu, value) in enumerate([(0.001, 0.50), (0.02, 0.71), (0.3, 0.64), (0.9, 0.40)]):
        make_run(tmp_path / "s", str(i), mu, 0, [value], objective=value, search=True)
    figures = {}
    monkeypatch.setattr(
        plots, "_save", lambda plt, fig, path, drawn: figures.setdefault(path.stem, fig) or drawn
    )
    assert main([str(tmp_path / "s"), "--out", str(tmp_path / "out")]) == 0
    md = (tmp_path / "out" / "report.md").read_text()
    assert "## Hyperparameter search" in md
    assert (
        "4 completed trials, maximize `eval/val/global/acc`; best 0.7100 at `algorithm.mu` = 0.02"
        in md
    )
    (ax,) = figures["search"].axes
    trials, best = ax.collections
    assert best.get_offsets().tolist() == [[0.02, 0.71]]
    assert sorted(trials.get_offsets()[:, 1].tolist()) == pytest.approx([0.40, 0.50, 0.64, 0.71])
    assert ax.get_xscale() == "log"  # a log-searched parameter on a log axis
