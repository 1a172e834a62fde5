"""The one protocol for everything that watches a run: loggers, checkpoints, progress, audits.

A run calls, on every callback in its one `callbacks` list, in list order:

    on_run_start(info)          once, before the first round (after a resume's restore)
    for each round t:
        on_evaluate(report)     evaluation rounds only, once the model is evaluated
        on_round_end(report)    every round, once its metrics are complete
    on_run_end(summary)         once, after the last round (or a divergence or a stop signal)

Callbacks see the run through frozen reports, never through the round loop itself. The one way a
callback adds metrics: `on_evaluate` returns a dict (or None); the loop merges it into the round's
metrics, in list order, before any callback's `on_round_end` sees the round, so loggers log the
audit's `privacy/*` metrics in the same row as the evaluation. A later callback's `on_evaluate`
sees the metrics the earlier ones added. Raising from `on_round_end` stops the run (the
checkpointer raises `Interrupted` after a stop signal).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fedexp.core.summary import RunSummary
    from fedexp.core.types import ServerState


def frozen(mapping: Mapping | None) -> Mapping:
    """A read-only copy of `mapping`."""
    return MappingProxyType(dict(mapping or {}))


@dataclass(frozen=True)
class RunInfo:
    """What a callback learns before the first round.

    Attributes:
        run_dir: the run directory.
        config: the resolved config, as plain containers.
        run_name: the run's display name (`fedexp.loggers.progress.run_label`: algorithm,
            dataset, the values a sweep varies, seed).
        group: the multirun sweep's name (None for a single run).
        rounds: the last round of the run.
        resumed_from_round: the checkpoint's round on resume (rounds after it run again), else None.
        artifacts: (path, kind) of the files written before the first round (partition
            statistics). The PNG among them is drawn while the first rounds run unless a logger
            that records files (`log_artifact`) is among the callbacks; it is complete when
            the run ends.
        objective: the resolved `objective` (`auto` made a metric name), if known.
        choices: the Hydra group choices of the run (`algorithm`, `dataset`, ...), the dataset
            labelled by an overridden `dataset._target_`; empty outside Hydra.
        checkpoint_file: the name of the run's checkpoint file in `run_dir`.
    """

    run_dir: Path
    config: Mapping[str, Any]
    run_name: str
    group: str | None
    rounds: int
    resumed_from_round: int | None = None
    artifacts: tuple[tuple[Path, str], ...] = ()
    objective: str | None = None
    choices: Mapping[str, str] = field(default_factory=dict)
    checkpoint_file: str | None = None


@dataclass(frozen=True)
class RoundReport:
    """One round, as callbacks see it (read-only).

    Attributes:
        round: the round, from 1.
        last_round: the last round of the run.
        metrics: the round's metrics (on an evaluation round, the evaluation's and, in
            `on_round_end`, whatever `on_evaluate` callbacks added).
        evaluated: whether the round was evaluated (then its metrics include the evaluation's).
        state: the server state after the round (callbacks must not modify it).
        client_accs: per-client accuracies of the latest evaluation (`summary.json` client_acc).
        loop_state: the round loop's resumable state after the round (`Orchestrator.state_dict`).
    """

    round: int
    last_round: int
    metrics: Mapping[str, Any]
    evaluated: bool
    state: ServerState
    client_accs: Mapping[str, Any] = field(default_factory=dict)
    loop_state: Mapping[str, Any] = field(default_factory=dict)


class Callback:
    """Base class of run callbacks: every hook is a no-op; override the ones you need."""

    def on_run_start(self, info: RunInfo) -> None:
        """Before the first round."""

    def on_evaluate(self, report: RoundReport) -> Mapping[str, float] | None:
        """After an evaluation; a returned dict is merged into the round's metrics."""
        return None

    def on_round_end(self, report: RoundReport) -> None:
        """After every round, with its complete metrics."""

    def on_run_end(self, summary: RunSummary) -> None:
        """After the last round, with the run's summary."""


def run_start(callbacks: Sequence[Callback], info: RunInfo) -> None:
    for callback in callbacks:
        callback.on_run_start(info)


def run_end(callbacks: Sequence[Callback], summary: RunSummary) -> None:
    for callback in callbacks:
        callback.on_run_end(summary)


class RoundFunction(Callback):
    """`fn(round, metrics)` after every round (a quick watcher for scripts and tests)."""

    def __init__(self, fn) -> None:
        self.fn = fn

    def on_round_end(self, report: RoundReport) -> None:
        self.fn(report.round, dict(report.metrics))
