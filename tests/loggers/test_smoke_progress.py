"""`debug=smoke` shows its progress as any run does: the round lines and the completion line off a
terminal; on a terminal (a progress bar) the completion line once the bar is gone."""

from __future__ import annotations

import re

import pytest

from fedexp.core.callbacks import RoundReport
from fedexp.core.summary import Objective, RunSummary, Timing
from fedexp.loggers import progress
from fedexp.loggers.progress import ProgressLines, progress_callbacks

# what the command line prints
pytestmark = pytest.mark.cli


def test_a_smoke_run_prints_its_round_lines_and_the_completion_line(cli_in_process):
    proc = cli_in_process("debug=smoke", "hydra.run.dir=run")
    rounds = [line.split("  ")[0] for line in proc.stdout.splitlines() if line.startswith("round")]
    assert rounds == ["round 1/2", "round 2/2"]
    done = r"^completed after 2 rounds \(\d+s\); eval/val/global/acc \d\.\d{4}$"
    assert re.search(done, proc.stdout, re.MULTILINE), proc.stdout


class Bar:
    """A progress bar as on a terminal."""


def test_with_a_progress_bar_only_the_completion_line_is_printed(monkeypatch, capsys):
    def when_watched(total, enabled=True):
        return Bar() if enabled else None

    monkeypatch.setattr(progress.ProgressBar, "when_watched", staticmethod(when_watched))
    bar, lines = progress_callbacks(20, "train/loss", enabled=True, every_s=None)
    assert isinstance(bar, Bar) and isinstance(lines, ProgressLines)
    lines.on_round_end(RoundReport(20, 20, {"train/loss": 0.25}, True, state=None))
    assert capsys.readouterr().out == ""  # the bar shows the rounds
    lines.on_run_end(RunSummary("completed", 20, objective=Objective("train/loss", 0.25)))
    assert capsys.readouterr().out == "completed after 20 rounds; train/loss 0.2500\n"
    (quiet,) = progress_callbacks(20, "train/loss", enabled=False, every_s=None)
    summary = RunSummary("completed", 20, timing=Timing(3.0, 0.1))
    quiet.on_run_end(summary)
    assert capsys.readouterr().out == ""  # progress=false: the run's log only
