"""Hydra callbacks of a multirun (registered in conf/config.yaml under `hydra.callbacks`).

`SweepSummary` (`sweep_summary`): when a sweep ends, print the grouped table of its runs (mean ±
std over seeds; the groups are the config values that differ, as in `python -m fedexp.report`)
and write the report into `<sweep dir>/report/`. Turn it off with `~hydra.callbacks.sweep_summary`.

`QuietSetup` (`quiet_setup`): keeps the set-up chatter of the libraries an Optuna sweeper loads
(alembic's plugin list, Optuna's "A new study created" line) out of the sweep's output.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback

from fedexp.report import group_runs, mean_std

log = logging.getLogger(__name__)
# the columns besides the objective, when some run has them
SHOWN = ("eval/global/acc", "eval/personal/acc_mean", "eval/group/gap", "privacy/mia_auc")


class QuietSetup(Callback):
    """Raise the log level of alembic and Optuna to WARNING before the sweeper loads them."""

    def on_multirun_start(self, config: Any, **kwargs: Any) -> None:
        logging.getLogger("alembic").setLevel(logging.WARNING)
        sweeper = str(config.hydra.sweeper.get("_target_", ""))
        if "optuna" in sweeper.lower():  # Optuna sets its own level when first imported
            import optuna

            optuna.logging.set_verbosity(optuna.logging.WARNING)


class SweepSummary(Callback):
    """At the end of a multirun: the grouped table on stdout, the report in the sweep dir.

    Args:
        report: also write `<sweep dir>/report/report.md` with its plots.
    """

    def __init__(self, report: bool = True) -> None:
        self.report = report

    def on_multirun_end(self, config: Any, **kwargs: Any) -> None:
        from fedexp.report import find_runs, write_report

        sweep_dir = Path(str(config.hydra.sweep.dir))
        runs = find_runs([sweep_dir])
        if not runs:
            return
        print_sweep_table(runs, sweep_dir)
        if not self.report:
            return
        try:
            report = write_report([sweep_dir], sweep_dir / "report")
        except Exception as err:  # the runs are safe on disk; a plot failing must not hide them
            log.warning("the sweep report could not be written (%s)", err)
            return
        print(f"report: {report}")


def sweep_rows(runs: list) -> tuple[list[str], list[str], list[list[str]]]:
    """(the keys that differ, the column heads, one row of cells per group) of a sweep's runs.

    Cells are mean ± sample std (ddof = 1, as in the report) over the completed runs of a group
    (its seeds); the `runs` cell counts the others by status (`2 (+1 diverged)`).
    """
    groups, keys = group_runs(runs)
    objectives = {r.summary.objective.name for r in runs if r.summary.objective is not None}
    objectives.discard(None)
    objective = f"objective: {objectives.pop()}" if len(objectives) == 1 else "objective"
    present = {k for r in runs for k in r.summary.metrics}
    shown = [k for k in SHOWN if k in present]
    heads = ["group", "runs", objective, *shown]
    rows = []
    for name, members in groups.items():
        done = [r for r in members if r.completed]
        other = sorted({r.summary.status for r in members if not r.completed})
        failed = len(members) - len(done)
        count = f"{len(done)}" + (f" (+{failed} {', '.join(other)})" if failed else "")
        values = [[r.summary.objective.value for r in done if r.summary.objective is not None]]
        values += [[r.summary.metrics.get(k) for r in done] for k in shown]
        rows.append([name, count, *(cell(*mean_std(v)) for v in values)])
    return [k.removeprefix("choice:") for k in keys], heads, rows


def cell(mean: float, std: float) -> str:
    return "–" if mean != mean else f"{mean:.4f} ± {std:.4f}"  # NaN: no completed run


def print_sweep_table(runs: list, sweep_dir: Path) -> None:
    """The grouped table of a sweep's runs (rich), titled with what the groups differ in."""
    from rich.console import Console
    from rich.table import Table

    keys, heads, rows = sweep_rows(runs)
    differ = ", ".join(keys) or "nothing (one group)"
    table = Table(
        title=f"sweep {sweep_dir}: {len(runs)} runs in {len(rows)} groups, differing in {differ}",
        caption="mean ± sample std (ddof = 1) over the seeds of each group",
    )
    for i, head in enumerate(heads):
        table.add_column(head, justify="left" if i == 0 else "right")
    for row in rows:
        table.add_row(*row)
    Console(file=sys.stdout, width=max(120, Console().width)).print(table)
