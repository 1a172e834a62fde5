"""Per-round progress: a rich bar on a terminal, plain lines elsewhere (SLURM logs, `| tee`).

`ProgressLines` writes a line (round, train loss, the objective when evaluated, seconds per
round, ETA) on each evaluated round, the last round, and any round ending `every_s` seconds or
more after the previous line (`progress_every_s`), to the logger `fedexp.progress`, which Hydra's
job logging (conf/hydra/job_logging/fedexp.yaml) sends to the run's `__main__.log` only; with
`echo` it also prints the line to stdout. `progress_callbacks` picks what a run gets.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Sequence

from fedexp.core.callbacks import Callback, RoundReport, RunInfo
from fedexp.core.summary import RunSummary

PROGRESS_LOGGER = "fedexp.progress"
log = logging.getLogger(PROGRESS_LOGGER)


class NotProgress(logging.Filter):
    """Drops the progress lines (logger `fedexp.progress`): for a console handler."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.name.startswith(PROGRESS_LOGGER)


def run_label(choices: dict, seed, swept: Sequence[tuple[str, str]] = ()) -> str:
    """`fedprox-digits-mu0.01-s0`: the algorithm, the dataset, the values a sweep varies
    (`wandb_labels.swept_values`: `key` + value, a group choice by its value alone) and the seed."""
    values = [v if k in choices else f"{k}{v}" for k, v in swept]
    head = [str(choices.get("algorithm")), str(choices.get("dataset"))]
    return "-".join([*head, *values, f"s{seed}"])


def duration(seconds: float) -> str:
    """`42s`, `3m07s`, `2h05m`: a short, human duration."""
    seconds = max(int(round(seconds)), 0)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


class ProgressLines(Callback):
    """Plain progress lines, e.g.
    `round 10/50  train/loss 0.4210  eval/val/global/acc 0.8312  0.42 s/round  ETA 17s`:
    on every evaluated round, the last round, and a round that ends `every_s` seconds or more
    after the previous line. So with rounds quicker than `every_s` a line comes about every
    `every_s` seconds (and on evaluations); with slower rounds, one each round.

    s/round is the wall time since the run started (evaluations included) over the rounds run
    since; ETA is that rate times the rounds left. In a sweep the line starts with the run's name
    (`run_label`: the algorithm, the dataset, the values the sweep varies and the seed).

    Args:
        objective: the metric shown (the run's resolved `objective`).
        echo: also print the line to stdout (when no progress bar is shown there).
        every_s: a round ending this many seconds or more after the previous line gets a line
            (`progress_every_s`; 0: every round); None: evaluated rounds and the last only.
        echo_end: also print the completion line (`completed after 50 rounds (3m07s); ...`)
            to stdout; None: as `echo`. A run with a progress bar prints it once the bar is
            gone (the bar is transient and leaves nothing behind).
    """

    def __init__(
        self,
        objective: str,
        echo: bool = True,
        every_s: float | None = None,
        echo_end: bool | None = None,
    ):
        self.objective = objective
        self.echo = echo
        self.echo_end = echo if echo_end is None else echo_end
        self.every_s = every_s
        self.prefix = ""
        self.first_round = 1
        self.start = self.last_line = time.perf_counter()

    def on_run_start(self, info: RunInfo) -> None:
        self.prefix = f"[{info.run_name}] " if info.group is not None else ""
        self.first_round = (info.resumed_from_round or 0) + 1
        self.start = self.last_line = time.perf_counter()
        self._emit(f"{info.rounds} rounds, objective {self.objective}; run dir {info.run_dir}")

    def on_round_end(self, report: RoundReport) -> None:
        now = time.perf_counter()
        due = self.every_s is not None and now - self.last_line >= self.every_s
        if not (report.evaluated or report.round == report.last_round or due):
            return
        self.last_line = now
        per_round = (now - self.start) / max(report.round - self.first_round + 1, 1)
        parts = [f"round {report.round}/{report.last_round}"]
        for key in dict.fromkeys(("train/loss", self.objective)):  # once if the objective
            value = report.metrics.get(key)
            if isinstance(value, (int, float)):
                parts.append(f"{key} {value:.4f}")
        parts += [
            f"{per_round:.2f} s/round",
            f"ETA {duration(per_round * (report.last_round - report.round))}",
        ]
        self._emit("  ".join(parts))

    def on_run_end(self, summary: RunSummary) -> None:
        value = summary.objective.value if summary.objective is not None else None
        shown = f"{value:.4f}" if isinstance(value, (int, float)) else "-"
        wall = f" ({duration(summary.timing.wall_time_s)})" if summary.timing else ""
        self._emit(
            f"{summary.status} after {summary.rounds_completed} rounds{wall}; "
            f"{self.objective} {shown}",
            echo=self.echo_end,
        )

    def _emit(self, line: str, echo: bool | None = None) -> None:
        line = self.prefix + line
        log.info("%s", line)
        if self.echo if echo is None else echo:
            print(line, flush=True)


class ProgressBar(Callback):
    """A transient rich progress bar: the round and, on evaluated rounds, the accuracy.

    Also a context manager, so the bar is taken down when a run ends by an exception.
    """

    def __init__(self, total: int):
        from rich.progress import Progress

        self.bar = Progress(transient=True)
        self.task = self.bar.add_task("rounds", total=total)

    @classmethod
    def when_watched(cls, total: int, enabled: bool = True) -> ProgressBar | None:
        """A bar when a person is watching; None under tests or pipes (or when disabled)."""
        return cls(total) if enabled and sys.stdout.isatty() else None

    def on_run_start(self, info: RunInfo) -> None:
        self.bar.start()

    def on_round_end(self, report: RoundReport) -> None:
        metrics = report.metrics
        acc = metrics.get("eval/global/acc", metrics.get("eval/personal/acc_mean"))
        desc = f"round {report.round}" + (f"  acc {acc:.3f}" if acc is not None else "")
        self.bar.update(self.task, completed=report.round, description=desc)

    def on_run_end(self, summary: RunSummary) -> None:
        self.bar.stop()

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(self, *exc) -> None:
        self.bar.stop()


def progress_callbacks(
    rounds: int, objective: str, enabled: bool, every_s: float | None
) -> list[Callback]:
    """What a run shows of its progress: with `enabled` (`progress=true`) a bar on a terminal,
    else plain lines on stdout (`ProgressLines`, a line at least every `every_s` seconds where
    the rounds are quicker), and the completion line on stdout either way; the lines always go
    to the run's log file.

    The bar, if any, comes first in the list (`__main__` takes it down on an exception).
    """
    bar = ProgressBar.when_watched(rounds, enabled)
    lines = ProgressLines(
        objective, echo=enabled and bar is None, every_s=every_s, echo_end=enabled
    )
    return [bar, lines] if bar is not None else [lines]
