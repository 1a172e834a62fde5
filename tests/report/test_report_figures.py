"""Figures a paper can use: identical curves both visible, whole-round ticks, a shared y-axis on
request, DP-FedAvg's ε in a table and a figure with the numbers the runs wrote."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

import fedexp.report.plots as plots
import fedexp.report.privacy as privacy
from fedexp.report import main, write_report


def make_run(root: Path, name: str, sigma: float, seed: int, rows: list[dict], **summary_extra):
    """A DP-FedAvg-like run dir: metrics.jsonl rows (round added), summary of the last row."""
    run = root / name
    run.mkdir(parents=True)
    rows = [{"round": t, **row} for t, row in enumerate(rows, start=1)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = {"seed": seed, "algorithm": {"noise_multiplier": sigma, "delta": 1e-5}}
    summary = {
        "status": "completed",
        "rounds_completed": len(rows),
        "metrics": rows[-1],
        "client_acc": {"global": [0.5, 0.7]},
        "choices": {"algorithm": "dp_fedavg", "dataset": "digits"},
        "config": config,
        **summary_extra,
    }
    (run / "summary.json").write_text(json.dumps(summary))
    return run


@pytest.fixture
def figures(monkeypatch):
    """name -> the Figure each plot built (not laid out, not written)."""
    found: dict[str, Figure] = {}

    def keep(plt, fig, path, drawn):
        found[path.stem] = fig
        return drawn

    monkeypatch.setattr(plots, "_save", keep)
    monkeypatch.setattr(privacy, "_save", keep)
    monkeypatch.setattr(Figure, "tight_layout", lambda self, **kw: None)
    yield found
    import matplotlib.pyplot as plt

    plt.close("all")


def acc(g: float, p: float) -> dict:
    return {"eval/global/acc": g, "eval/personal/acc_mean": p}


def test_groups_get_distinct_marker_and_line_style_pairs():
    names = [f"g{i}" for i in range(32)]
    pairs = list(plots.styles(names).values())
    assert len(set(pairs)) == 32
    # neighbours differ in both marker and line style
    assert all(a[0] != b[0] and a[1] != b[1] for a, b in zip(pairs, pairs[1:]))


def test_identical_curves_are_both_visible(tmp_path, figures):
    rows = [acc(0.1 * t, 0.5) for t in range(1, 10)]  # 9 rounds
    for i, sigma in enumerate((0.5, 1.0, 2.0)):  # three groups with exactly the same curve
        make_run(tmp_path / "r", str(i), sigma, 0, rows)
    write_report([tmp_path / "r"], tmp_path / "out")
    for ax in figures["acc_vs_round"].axes:
        lines = ax.get_lines()
        assert len(lines) == 3
        np.testing.assert_array_equal(lines[0].get_ydata(), lines[2].get_ydata())
        assert len({(line.get_marker(), line.get_linestyle()) for line in lines}) == 3
        assert all(line.get_markerfacecolor() == "none" for line in lines)  # hollow markers
        # markers every 3rd round, staggered: rounds 1, 4, 7 / 2, 5, 8 / 3, 6, 9
        marked = []
        for line in lines:
            start, step = line.get_markevery()
            marked.append(line.get_xdata()[start::step].tolist())
        assert marked == [[1, 4, 7], [2, 5, 8], [3, 6, 9]]


def test_round_axes_tick_at_whole_rounds_even_for_one_round(tmp_path, figures):
    make_run(tmp_path / "r", "0", 1.0, 0, [acc(0.3, 0.5) | {"privacy/epsilon": 2.5}])
    write_report([tmp_path / "r"], tmp_path / "out")
    axes = [*figures["acc_vs_round"].axes, figures["privacy"].axes[0]]
    for ax in axes:
        locator = ax.xaxis.get_major_locator()
        assert isinstance(locator, MaxNLocator)
        ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
        assert ticks == [1.0]  # the one round, no 0.98 / 1.02


def test_sharey_puts_global_and_personal_panels_on_one_axis(tmp_path, figures):
    # global accuracies around 0.2, personal ones around 0.9: ranges that do not overlap
    for seed in (0, 1):
        rows = [acc(0.1 + 0.1 * seed, 0.85), acc(0.2 + 0.1 * seed, 0.95)]
        make_run(tmp_path / "r", str(seed), 1.0, seed, rows)
    write_report([tmp_path / "r"], tmp_path / "own")
    own = [ax.get_ylim() for ax in figures["acc_vs_round"].axes]
    assert own[0][1] < own[1][0]  # each panel its own range
    assert main([str(tmp_path / "r"), "--out", str(tmp_path / "shared"), "--sharey"]) == 0
    for name in ("acc_vs_round", "final_acc"):
        limits = {ax.get_ylim() for ax in figures[name].axes}
        assert len(limits) == 1, name
    (low, high) = figures["acc_vs_round"].axes[0].get_ylim()
    assert low < 0.2 and high > 0.95  # both panels' data fit the shared range


def test_sharey_is_documented_in_help(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "--sharey" in capsys.readouterr().out


def test_epsilon_table_and_figure_hold_the_numbers_the_runs_wrote(tmp_path, figures):
    # sigma=1: eps 1.5, 3.0 (seed 0) and 2.0, 4.0 (seed 1): final mean 3.5, sample std sqrt(0.5)
    eps = {0: (1.5, 3.0), 1: (2.0, 4.0)}
    for seed in (0, 1):
        rows = [acc(0.2, 0.5) | {"privacy/epsilon": e} for e in eps[seed]]
        make_run(tmp_path / "r", f"dp{seed}", 1.0, seed, rows)
    # sigma=0: no noise, eps inf, written as null
    make_run(tmp_path / "r", "plain", 0.0, 0, [acc(0.4, 0.5) | {"privacy/epsilon": None}] * 2)
    md = write_report([tmp_path / "r"], tmp_path / "out").read_text()
    table = md.split("## Privacy budget (DP)")[1].split("\n## ")[0]
    assert "| algorithm.noise_multiplier=0 | 1 | 1e-05 | inf | 0.4000 |" in table
    assert "| algorithm.noise_multiplier=1 | 2 | 1e-05 | 3.500 ± 0.707 | 0.2000 |" in table
    assert "inf (no noise or no clipping) in algorithm.noise_multiplier=0: not drawn" in md
    left, right = figures["privacy"].axes
    (line,) = left.get_lines()  # the inf group is not drawn
    assert line.get_xdata().tolist() == [1, 2]
    assert line.get_ydata().tolist() == pytest.approx([1.75, 3.5])  # mean over the seeds
    (line,) = right.get_lines()
    assert line.get_xdata().tolist() == pytest.approx([1.75, 3.5])  # accuracy vs ε
    assert line.get_ydata().tolist() == pytest.approx([0.2, 0.2])


def test_no_epsilon_no_privacy_section(tmp_path, figures):
    make_run(tmp_path / "r", "0", 1.0, 0, [acc(0.3, 0.5)])
    md = write_report([tmp_path / "r"], tmp_path / "out").read_text()
    assert "Privacy budget" not in md and "privacy" not in figures
