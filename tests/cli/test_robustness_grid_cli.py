"""A 2 x 2 corner of the robustness grid through the CLI (`python -m fedexp -m
experiment=robustness_digits attack=none,sign_flip aggregator=mean,bulyan`, two rounds): the
sweep prints the grid with its 4 cells, each the job's own final accuracy, and the report has it."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.slow


def test_a_corner_of_the_grid_prints_four_cells_from_its_jobs(cli_in_process):
    args = ["experiment=robustness_digits", "attack=none,sign_flip", "aggregator=mean,bulyan"]
    args += ["debug=smoke", "num_clients=15", "clients_per_round=15", "hydra.sweep.dir=sweep"]
    proc = cli_in_process(*args, multirun=True, env={"OMP_NUM_THREADS": "1"})
    sweep = cli_in_process.cwd / "sweep"
    acc = {}
    for job in sorted(p for p in sweep.iterdir() if (p / "summary.json").exists()):
        summary = json.loads((job / "summary.json").read_text())
        assert summary["status"] == "completed" and summary["rounds_completed"] == 2
        assert summary["describe"]["attack/num_malicious"] == (
            0 if summary["choices"]["attack"] == "none" else 3  # 20 % of 15: f = 3, n = 4f + 3
        )
        pair = (summary["choices"]["aggregator"], summary["choices"]["attack"])
        acc[pair] = summary["metrics"]["eval/global/acc"]
    assert len(acc) == 4
    assert "aggregator × attack:" in proc.stdout
    grid = proc.stdout.split("aggregator × attack:")[1]
    rows = [line for line in grid.splitlines() if line.startswith("| ")]
    assert rows[0] == "| aggregator | attack=none | attack=sign_flip |"
    for line, aggregator in zip(rows[1:], ("mean", "bulyan"), strict=True):
        clean, flipped = acc[(aggregator, "none")], acc[(aggregator, "sign_flip")]
        delta = round(flipped - clean, 3) + 0.0
        assert line == f"| {aggregator} | {clean:.3f} | {flipped:.3f} (Δ {delta:+.3f}) |"
    report = (sweep / "report" / "report.md").read_text()
    assert "## Grid: aggregator × attack" in report
    assert sum(line.startswith(("| mean |", "| bulyan |")) for line in report.splitlines()) == 2
