"""Plain-text progress lines, the final table's title and best round, and a sweep's grouped table.

Numbers are chosen to be checked by hand: a fake clock, objective values 0.5/0.7 (mean 0.6,
sample std (ddof = 1) 0.1414, as in the report).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from fedexp.__main__ import best_round, run_title
from fedexp.core.callbacks import RoundReport, RunInfo
from fedexp.core.summary import Objective, RunSummary, Timing
from fedexp.loggers import progress
from fedexp.loggers.progress import NotProgress, ProgressLines, duration
from fedexp.report import Run
from fedexp.sweep import sweep_rows


def report(round_: int, evaluated: bool = True, **metrics) -> RoundReport:
    return RoundReport(round_, 20, metrics, evaluated, state=None)


def info(group: str | None = None, resumed: int | None = None) -> RunInfo:
    return RunInfo(Path("/r"), {}, "fedavg-digits-s0", group, 20, resumed_from_round=resumed)


@pytest.fixture
def clock(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(progress.time, "perf_counter", lambda: now[0])
    return now


def test_one_line_per_evaluated_round_with_rate_and_eta(clock, capsys, caplog):
    lines = ProgressLines("eval/val/global/acc")
    lines.on_run_start(info())
    clock[0] += 3.0
    lines.on_round_end(report(3, evaluated=False, **{"train/loss": 0.9}))
    clock[0] += 7.0  # 10 s for 5 rounds: 2 s/round, 15 rounds left
    caplog.clear()  # the start line is logged too where an earlier test left INFO on
    with caplog.at_level(logging.INFO, logger="fedexp.progress"):
        lines.on_round_end(report(5, **{"train/loss": 0.5, "eval/val/global/acc": 0.75}))
    out = capsys.readouterr().out.splitlines()
    assert out == [
        "20 rounds, objective eval/val/global/acc; run dir /r",
        "round 5/20  train/loss 0.5000  eval/val/global/acc 0.7500  2.00 s/round  ETA 30s",
    ]
    assert [r.getMessage() for r in caplog.records] == [out[1]]  # the log file gets it too
    assert not NotProgress().filter(caplog.records[0])  # ... and the console handler does not


def test_a_resumed_run_counts_its_rate_from_the_checkpoint_and_a_sweep_names_the_run(clock, capsys):
    lines = ProgressLines("train/loss")
    lines.on_run_start(info(group="sweep", resumed=10))
    clock[0] += 40.0  # rounds 11..20 in 40 s
    lines.on_round_end(report(20, **{"train/loss": 0.25}))
    last = capsys.readouterr().out.splitlines()[-1]
    assert last == "[fedavg-digits-s0] round 20/20  train/loss 0.2500  4.00 s/round  ETA 0s"
    summary = RunSummary("completed", 20, objective=Objective("train/loss", 0.25))
    lines.on_run_end(summary)
    assert (
        capsys.readouterr().out
        == "[fedavg-digits-s0] completed after 20 rounds; train/loss 0.2500\n"
    )


def test_echo_off_prints_nothing(clock, capsys):
    lines = ProgressLines("eval/global/acc", echo=False)
    lines.on_run_start(info())
    lines.on_round_end(report(5, **{"eval/global/acc": 0.5}))
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize(
    ("seconds", "text"), [(0.4, "0s"), (59, "59s"), (187, "3m07s"), (7500, "2h05m")]
)
def test_duration(seconds, text):
    assert duration(seconds) == text


def test_the_title_names_the_run_and_the_overrides_that_matter():
    choices = {"algorithm": "fedprox", "dataset": "cifar10"}
    overrides = ["algorithm=fedprox", "algorithm.mu=0.01", "+client.lr=0.1", "seed=1",
                 "device=cpu", "progress=false", "logger=wandb", "hydra.run.dir=x"]  # fmt: skip
    assert (
        run_title(choices, overrides)
        == "fedprox on cifar10 (algorithm.mu=0.01 client.lr=0.1 seed=1)"
    )
    assert run_title(choices) == "fedprox on cifar10"


def test_best_round_is_the_highest_accuracy_or_the_lowest_loss(tmp_path):
    rows = [
        {"round": 5, "eval/val/global/acc": 0.6, "train/loss": 0.9},
        {"round": 10, "eval/val/global/acc": 0.8, "train/loss": 0.5},
        {"round": 15, "eval/val/global/acc": 0.8, "train/loss": 0.7},  # a tie: the earlier
        {"round": 20, "eval/val/global/acc": 0.7, "train/loss": 0.6},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + "{half")
    assert best_round(tmp_path, "eval/val/global/acc") == (10, 0.8)
    assert best_round(tmp_path, "train/loss") == (10, 0.5)
    assert best_round(tmp_path, "eval/personal/acc_mean") is None
    assert best_round(tmp_path / "none", "train/loss") is None


def fake_run(lr: float, seed: int, value: float | None, status: str = "completed") -> Run:
    summary = RunSummary(
        status,
        rounds_completed=10,
        metrics={"eval/global/acc": value} if value is not None else {},
        config={"seed": seed, "client": {"lr": lr}},
        choices={"algorithm": "fedavg"},
        objective=Objective("eval/val/global/acc", value),
        timing=Timing(1.0, 0.1),
    )
    return Run(Path(f"/s/{lr}-{seed}"), summary)


def test_the_sweep_table_is_mean_and_sample_std_over_seeds():
    runs = [
        fake_run(0.1, 0, 0.5),
        fake_run(0.1, 1, 0.7),
        fake_run(0.01, 0, 0.2),
        fake_run(0.01, 1, 0.4),
        fake_run(0.01, 2, None, status="diverged"),  # counted, not averaged
    ]
    keys, heads, rows = sweep_rows(runs)
    assert keys == ["client.lr"]
    assert heads == ["group", "runs", "objective: eval/val/global/acc", "eval/global/acc"]
    assert rows == [
        ["client.lr=0.01", "2 (+1 diverged)", "0.3000 ± 0.1414", "0.3000 ± 0.1414"],
        ["client.lr=0.1", "2", "0.6000 ± 0.1414", "0.6000 ± 0.1414"],
    ]
