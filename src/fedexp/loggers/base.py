"""`Logger`: a run callback that records every round; subclasses write one format."""

from __future__ import annotations

from pathlib import Path

from fedexp.core.callbacks import Callback, RoundReport, RunInfo
from fedexp.core.summary import RunSummary


class Logger(Callback):
    """Maps the callback hooks onto what a logger does; every method is a no-op here.

    `on_run_start`: on resume, cut the log back to the checkpoint's round (`truncate`: those
    rounds run and are logged again), then `start` and log the files written before the first
    round; `on_round_end`: `log_metrics` of every round (the training metrics, `train/loss`,
    `comm/*`, `time/*`, ...; an evaluated round's also the evaluation's); `on_run_end`: `finish`.
    """

    def on_run_start(self, info: RunInfo) -> None:
        if info.resumed_from_round is not None:
            self.truncate(info.resumed_from_round)
        self.start(dict(info.config), info.run_name, info.group)
        for path, kind in info.artifacts:
            self.log_artifact(path, kind)

    def on_round_end(self, report: RoundReport) -> None:
        self.log_metrics(dict(report.metrics), step=report.round)

    def on_run_end(self, summary: RunSummary) -> None:
        self.finish(summary)

    def truncate(self, last_round: int) -> None:
        """Drop what was logged for rounds after `last_round` (a resume logs them again)."""

    def start(self, config: dict, run_name: str, group: str | None) -> None:
        """Open the log (config: the resolved run config)."""

    def log_metrics(self, metrics: dict, step: int) -> None:
        """Record one round's metrics."""

    def log_artifact(self, path: str | Path, kind: str) -> None:
        """Record a file (a PNG plot, a CSV table)."""

    def finish(self, summary: RunSummary) -> None:
        """Close the log with the run's summary."""


def logs_artifacts(callbacks) -> bool:
    """Whether one of `callbacks` is a logger that records files (overrides `log_artifact`):
    the files written before the first round must then be complete at `on_run_start`."""
    return any(
        isinstance(c, Logger) and type(c).log_artifact is not Logger.log_artifact for c in callbacks
    )
