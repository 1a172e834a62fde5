"""Plain-text progress lines, checked by hand against a fake clock."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from fedexp.core.callbacks import RoundReport, RunInfo
from fedexp.core.summary import Objective, RunSummary
from fedexp.loggers import progress
from fedexp.loggers.progress import NotProgress, ProgressLines, duration

# what the command line prints
pytestmark = pytest.mark.cli


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
