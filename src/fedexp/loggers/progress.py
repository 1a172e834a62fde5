"""A per-round progress line in the terminal (`progress=true` and stdout a terminal)."""

from __future__ import annotations

import sys

from fedexp.core.callbacks import Callback, RoundReport, RunInfo
from fedexp.core.summary import RunSummary


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
