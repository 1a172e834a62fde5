"""The run-comparison report on hand-made run dirs: grouping, mean ± std, which plots appear."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedexp.report import curve, find_runs, group_runs, main, mean_std


def make_run(root: Path, name: str, algorithm: str, seed: int, accs, status="completed", **extra):
    """A run dir as fedexp writes it: summary.json + metrics.jsonl (one row per round)."""
    run = root / name
    run.mkdir(parents=True)
    rows = [
        {
            "round": t,
            "eval/global/acc": a,
            "comm/up_bits_total": 8e6 * t,
            "comm/down_bits_total": 8e6 * t,
            **extra,
        }
        for t, a in enumerate(accs, start=1)
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = {"seed": seed, "algorithm": {"_target_": algorithm, "mu": 0.1}, "client": {"lr": 0.05}}
    summary = {
        "status": status,
        "rounds_completed": len(accs),
        "metrics": rows[-1],
        "client_acc": {"global": [accs[-1] - 0.1, accs[-1] + 0.1]},
        "choices": {"algorithm": algorithm, "dataset": "digits"},
        "config": config,
    }
    (run / "summary.json").write_text(json.dumps(summary))
    return run


def test_runs_group_by_what_differs_and_average_over_seeds(tmp_path):
    make_run(tmp_path, "0", "fedavg", 0, [0.2, 0.5])
    make_run(tmp_path, "1", "fedavg", 1, [0.4, 0.7])
    make_run(tmp_path, "2", "fedprox", 0, [0.3, 0.6])
    make_run(tmp_path, "3", "fedprox", 1, [0.3, 0.8])
    groups, keys = group_runs(find_runs([tmp_path]))
    # algorithm.mu is the same, algorithm._target_ is explained by the algorithm choice
    assert keys == ["choice:algorithm"]
    assert list(groups) == ["algorithm=fedavg", "algorithm=fedprox"]
    rounds, mean, std = curve(groups["algorithm=fedavg"], "eval/global/acc")
    assert rounds.tolist() == [1, 2]
    # (0.2 + 0.4) / 2 = 0.3 and (0.5 + 0.7) / 2 = 0.6; sample std sqrt(2 * 0.1^2 / 1)
    assert mean == pytest.approx([0.3, 0.6], abs=1e-12)
    assert std == pytest.approx([0.02**0.5, 0.02**0.5], abs=1e-12)
    assert mean_std([0.6, 0.8]) == pytest.approx((0.7, 0.02**0.5), abs=1e-12)
    assert mean_std([0.6, 0.8], ddof=0) == pytest.approx((0.7, 0.1), abs=1e-12)
    mean, std = mean_std([0.6])  # one seed: no spread
    assert mean == 0.6 and std != std


def test_a_config_key_sweep_is_labelled_by_the_key(tmp_path):
    a = make_run(tmp_path, "0", "fedavg", 0, [0.5])
    b = make_run(tmp_path, "1", "fedavg", 0, [0.5])
    summary = json.loads((b / "summary.json").read_text())
    summary["config"]["client"]["lr"] = 0.1
    (b / "summary.json").write_text(json.dumps(summary))
    groups, keys = group_runs(find_runs([a, b]))
    assert keys == ["client.lr"]
    assert list(groups) == ["client.lr=0.05", "client.lr=0.1"]  # the key, with its group prefix


def test_the_report_has_the_table_and_every_plot_that_has_data(tmp_path):
    extra = {"eval/group/gap": 0.25, "eval/group/minority/acc_mean": 0.4, "privacy/mia_acc": 0.55}
    make_run(tmp_path / "runs", "0", "fedavg", 0, [0.2, 0.5], **extra)
    make_run(tmp_path / "runs", "1", "fedavg", 1, [0.4, 0.7], **extra)
    make_run(tmp_path / "runs", "2", "fedprox", 0, [0.1, float("nan")], status="diverged")
    assert main([str(tmp_path / "runs"), "--out", str(tmp_path / "out")]) == 0
    md = (tmp_path / "out" / "report.md").read_text()
    table = [line for line in md.splitlines() if line.startswith("| algorithm=")]
    # sample std of 0.5 and 0.7: 0.1414; no `± 0` in columns without spread (rounds, gap, MIA)
    assert table[0].startswith("| algorithm=fedavg | 2 | 2 | 0.6000 ± 0.1414 |")
    assert "| 0.2500 |" in table[0] and "| 0.5500 |" in table[0] and "± 0.0000" not in md
    assert table[1].startswith("| algorithm=fedprox | 0 (+1 diverged) |")
    assert "eval/group/minority/acc_mean" in md
    assert "sample standard deviation (ddof = 1)" in md
    for png in (
        "acc_vs_round",
        "final_acc",
        "client_acc_box",
        "acc_vs_comm",
        "group_gap",
        "mia_acc",
    ):
        assert f"({png}.png)" in md
        assert (tmp_path / "out" / f"{png}.png").read_bytes()[:4] == b"\x89PNG"


def test_no_runs_is_an_error(tmp_path, capsys):
    assert main([str(tmp_path)]) == 2
    assert "no summary.json" in capsys.readouterr().err
