"""The report never fails on a valid run dir: what a run lacks is left out and report.md says so.

Each variant damages one group's runs the way real runs are damaged (FRL without local test
splits records no per-client accuracy; null/NaN values; a metric some runs lack; one round; a
diverged or interrupted run; no metrics.jsonl; no communication counters) beside a healthy group.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import fedexp.report.plots as plots
import fedexp.report.privacy as privacy
from fedexp.report import write_report

NAN = float("nan")


def make_run(root: Path, name: str, algorithm: str, seed: int, accs, **kw) -> Path:
    """A run dir as fedexp writes it. kw: status, rows (extra keys in every metrics.jsonl row),
    metrics (replaces summary metrics), client_acc (None: the key left out), no_rows,
    no_comm."""
    run = root / name
    run.mkdir(parents=True)
    comm = {} if kw.get("no_comm") else {"comm/up_bits_total": 8e6, "comm/down_bits_total": 8e6}
    rows = [
        {"round": t, "eval/global/acc": a, **comm, **kw.get("rows", {})}
        for t, a in enumerate(accs, start=1)
    ]
    if not kw.get("no_rows"):
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = {
        "status": kw.get("status", "completed"),
        "rounds_completed": len(accs),
        "metrics": kw["metrics"] if "metrics" in kw else (rows[-1] if rows else {}),
        "choices": {"algorithm": algorithm, "dataset": "digits"},
        "config": {"seed": seed, "algorithm": {"_target_": algorithm}},
    }
    client_acc = kw.get("client_acc", {"global": [0.4, 0.6]})
    if client_acc is not None:
        summary["client_acc"] = client_acc
    (run / "summary.json").write_text(json.dumps(summary))
    return run


@pytest.fixture
def no_png(monkeypatch):
    """Figures are drawn from the data as usual, but neither laid out nor written (the slow
    part; the full path is taken by the last test of this file)."""
    from matplotlib.figure import Figure

    def close(plt, fig, path, drawn):
        plt.close(fig)
        return drawn

    monkeypatch.setattr(plots, "_save", close)
    monkeypatch.setattr(privacy, "_save", close)
    monkeypatch.setattr(Figure, "tight_layout", lambda self, **kw: None)


FRL = "algorithm=frl"
# variant -> (make_run keyword arguments for both seeds of the damaged group, lines report.md has)
VARIANTS = {
    "frl_without_client_accuracies": (
        {"client_acc": {}, "rows": {"frl/mask_change": 0.1}},
        [f"per-client accuracy: not recorded by {FRL} (no box)"],
    ),
    "summary_without_client_acc_key": (
        {"client_acc": None},
        [f"per-client accuracy: not recorded by {FRL} (no box)"],
    ),
    "client_accuracies_null_and_nan": (
        {"client_acc": {"global": [None, NAN], "personal": None}},
        [f"per-client accuracy: not recorded by {FRL} (no box)"],
    ),
    "final_accuracy_null": (
        {"metrics": {"eval/global/acc": None}},
        [f"`eval/global/acc`: null/NaN in {FRL} (– in the table)"],
    ),
    "nan_in_metrics_jsonl": (
        {"accs": [0.5, NAN]},
        [f"`eval/global/acc`: null/NaN in {FRL} (– in the table)"],
    ),
    "no_communication_counters": (
        {"no_comm": True},
        [f"communication: not recorded by {FRL} (– in the table)"],
    ),
    "diverged": (
        {"accs": [0.3, NAN], "status": "diverged"},
        [f"{FRL}: no completed run (diverged): left out of the final values"],
    ),
    "interrupted_without_metrics_jsonl": (
        {"accs": [], "status": "interrupted", "no_rows": True},
        [f"{FRL}: no completed run (interrupted)", "has no per-round metrics"],
    ),
    "single_round": ({"accs": [0.5]}, []),
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_a_damaged_but_valid_run_dir_is_reported_with_what_was_left_out(tmp_path, no_png, variant):
    kw, lines = VARIANTS[variant]
    kw = dict(kw)
    accs = kw.pop("accs", [0.4, 0.6])
    for seed in (0, 1):
        make_run(tmp_path / "runs", f"frl{seed}", "frl", seed, accs, **kw)
    make_run(tmp_path / "runs", "fedavg0", "fedavg", 0, [0.5, 0.7])  # a group of one run
    md = write_report([tmp_path / "runs"], tmp_path / "out").read_text()
    notes = md.split("## Left out")[1].split("\n## ")[0] if lines else md
    for line in lines:
        assert line in notes
    assert "fedavg" not in (notes if lines else "")  # the healthy group lacks nothing
    assert "## Accuracy vs round" in md  # drawn from the rounds the runs reached
    if not lines:
        assert "## Left out" not in md


def test_a_metric_some_runs_lack_is_the_mean_of_the_others_and_said(tmp_path, no_png):
    runs = tmp_path / "runs"
    make_run(runs, "0", "fedper", 0, [0.5], rows={"eval/personal/acc_mean": 0.8})
    make_run(runs, "1", "fedper", 1, [0.5], rows={"eval/personal/acc_mean": 0.6})
    make_run(runs, "2", "fedper", 2, [0.5])  # logged no personal accuracy
    make_run(runs, "3", "fedavg", 0, [0.5])
    md = write_report([runs], tmp_path / "out").read_text()
    row = next(line for line in md.splitlines() if line.startswith("| algorithm=fedper |"))
    # (0.8 + 0.6) / 2 = 0.7 over the two runs that have it; sample std sqrt(2 * 0.1^2 / 1)
    assert "| 0.7000 ± 0.1414 |" in row
    assert "recorded by 2 of 3 completed runs of algorithm=fedper (the mean of those)" in md
    assert "`eval/personal/acc_mean`: not recorded by algorithm=fedavg (– in the table)" in md
    assert "`eval/personal/acc_mean` vs round: not recorded by algorithm=fedavg" in md


def test_every_run_without_client_accuracies_has_no_box_plot_and_says_so(tmp_path):
    for seed in (0, 1):
        make_run(tmp_path / "r", str(seed), "frl", seed, [0.5, 0.6], client_acc={})
    md = write_report([tmp_path / "r"], tmp_path / "out").read_text()
    for png in ("acc_vs_round", "final_acc", "acc_vs_comm"):  # written in full
        assert (tmp_path / "out" / f"{png}.png").read_bytes()[:4] == b"\x89PNG"
    assert "- per-client accuracy: not recorded by frl (no box plot)" in md
    assert "client_acc_box.png" not in md
    row = next(line for line in md.splitlines() if line.startswith("| frl |"))
    assert row.startswith("| frl | 2 | 2 | 0.6000 |")  # both seeds end at 0.6: no spread


def test_what_every_group_lacks_is_said_once_for_all(tmp_path, no_png):
    for algorithm in ("frl", "fedavg"):
        make_run(tmp_path / "r", algorithm, algorithm, 0, [0.5], client_acc={}, no_comm=True)
    md = write_report([tmp_path / "r"], tmp_path / "out").read_text()
    assert "- per-client accuracy: not recorded by every group (no box plot)" in md
    assert "- communication: not recorded by every group (– in the table)" in md
