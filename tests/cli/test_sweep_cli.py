"""Through the CLI: a sweep ends with its grouped table and report, a run shows plain progress
lines when stdout is not a terminal (a sweep's prefixed with the swept values), and an Optuna
search prints no set-up chatter."""

from __future__ import annotations

import json
import statistics
import sys

import pytest
import torch

pytestmark = pytest.mark.experiment

SMOKE = ("debug=smoke", "device=cpu")


def sweep(monkeypatch, tmp_path, *args: str) -> None:
    from fedexp.__main__ import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FEDEXP_CACHE_DIR", str(tmp_path / "cache"))
    torch.set_num_threads(1)
    argv = ["fedexp", "-m", *SMOKE, *args, "hydra.sweep.dir=sweep"]
    monkeypatch.setattr(sys, "argv", argv)
    main()


def test_a_sweep_prints_its_grouped_table_and_writes_its_report(tmp_path, monkeypatch, capsys):
    sweep(monkeypatch, tmp_path, "client.lr=0.05,0.1", "seed=0,1")
    out = capsys.readouterr().out
    assert "4 runs in 2 groups, differing in client.lr" in out
    report = tmp_path / "sweep" / "report" / "report.md"
    assert f"report: {report.relative_to(tmp_path)}" in out
    assert "| client.lr=0.05 | 2 |" in report.read_text()
    for lr in (0.05, 0.1):  # each group's cell: mean ± sample std of its seeds' objective
        values = []
        for path in (tmp_path / "sweep").glob("*/summary.json"):
            summary = json.loads(path.read_text())
            if summary["config"]["client"]["lr"] == lr:
                values.append(summary["objective"]["value"])
        assert len(values) == 2
        cell = f"{statistics.fmean(values):.4f} ± {statistics.stdev(values):.4f}"
        row = next(ln for ln in out.splitlines() if f"lr={lr} " in ln and "±" in ln)
        assert cell in row, (cell, row)
    for job in (tmp_path / "sweep").glob("[0-9]"):  # progress lines name the swept values
        config = json.loads((job / "summary.json").read_text())["config"]
        prefix = f"[fedavg-digits-lr{config['client']['lr']}-s{config['seed']}] round 2/2  "
        assert prefix in (job / "__main__.log").read_text()


def test_the_sweep_summary_can_be_turned_off(tmp_path, monkeypatch, capsys):
    sweep(monkeypatch, tmp_path, "seed=0", "~hydra.callbacks.sweep_summary")
    assert "differing in" not in capsys.readouterr().out
    assert (tmp_path / "sweep" / "0" / "summary.json").exists()
    assert not (tmp_path / "sweep" / "report").exists()


def test_off_a_terminal_a_run_prints_progress_lines_and_logs_every_round(cli_in_process):
    # in this process: its stdout, captured, is no terminal either
    tmp_path = cli_in_process.cwd
    proc = cli_in_process(*SMOKE, "progress=true", "rounds=3", "eval_every=2", "client.lr=0.05",
                          "progress_every_s=0", "hydra.run.dir=run")  # fmt: skip
    lines = [line for line in proc.stdout.splitlines() if line.startswith("round ")]
    # progress_every_s=0: a line every round; the objective on evaluated rounds (2, 3)
    assert [line.split("  ")[0] for line in lines] == ["round 1/3", "round 2/3", "round 3/3"]
    assert all(" s/round  ETA " in line and "train/loss " in line for line in lines)
    assert ["eval/val/global/acc " in line for line in lines] == [False, True, True]
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [(r["round"], "train/loss" in r, "time/round_s" in r) for r in rows] == [
        (1, True, True), (2, True, True), (3, True, True)]  # fmt: skip
    assert "fedavg on digits (debug=smoke" in proc.stdout  # the final table names the run
    assert "client.lr=0.05" in proc.stdout and "best objective (round " in proc.stdout
    log = (tmp_path / "run" / "__main__.log").read_text()
    assert all(line in log for line in lines)
    assert proc.stdout.count("round 3/3") == 1  # the log's copy stays off the console


def test_progress_false_keeps_the_lines_in_the_log_only(cli_in_process):
    tmp_path = cli_in_process.cwd
    proc = cli_in_process(*SMOKE, "progress=false", "hydra.run.dir=run")
    assert "round 2/2" not in proc.stdout and "completed after" not in proc.stdout
    assert "round 2/2  train/loss " in (tmp_path / "run" / "__main__.log").read_text()
