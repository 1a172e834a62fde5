"""Hydra callbacks of a multirun (registered in conf/config.yaml under `hydra.callbacks`).

`SweepSummary` (`sweep_summary`): when a sweep ends, print the grouped table of its runs (mean ±
std over seeds; the groups are the config values that differ, as in `python -m fedexp.report`),
the data each column measures, the command that uploads the jobs' offline W&B runs (when there
are some), and write the report into `<sweep dir>/report/`. Turn it off with
`~hydra.callbacks.sweep_summary`. With `grid: aggregator,attack` (and `baseline: attack=none`)
it also prints the runs as one table of the two keys (`fedexp.report.grid`), and puts it in the
report.

`QuietSetup` (`quiet_setup`): keeps the set-up chatter of the libraries an Optuna sweeper loads
(alembic's plugin list, Optuna's "A new study created" line) out of the sweep's output.
"""

from __future__ import annotations

import logging
import shlex
import sys
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback

from fedexp.core.summary import metric_title
from fedexp.report import data_differences, fmt, group_runs, group_warnings, mean_std
from fedexp.report.grid import Grid, grid_table

log = logging.getLogger(__name__)
# the columns besides the objective, when some run has them
SHOWN = ("eval/global/acc", "eval/personal/acc_mean", "eval/finetuned/acc_mean", "eval/group/gap")
SHOWN += ("privacy/mia_auc", "attack/backdoor_asr", "attack/backdoor_asr_personal")


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
        grid: `ROW,COL`: also the runs as one table, a row per value of ROW and a column per
            value of COL (`aggregator,attack`); None: none.
        baseline: with `grid`, the column the others are compared with (`attack=none`).
    """

    def __init__(self, report: bool = True, grid: str | None = None, baseline: str | None = None):
        self.report = report
        self.grid = Grid.parse(grid, baseline) if grid else None

    def on_multirun_end(self, config: Any, **kwargs: Any) -> None:
        from fedexp.report import find_runs, write_report  # start-up: matplotlib, at the end only

        sweep_dir = Path(str(config.hydra.sweep.dir))
        runs = find_runs([sweep_dir])
        if runs:
            print_sweep_table(runs, sweep_dir)
        grid = self.grid if runs else None
        if grid:
            grid = print_grid(runs, grid)
        offline = wandb_offline_line(sweep_dir)
        if offline:
            print(offline)
        if not runs or not self.report:
            return
        try:
            report = write_report([sweep_dir], sweep_dir / "report", grid=grid)
        except Exception as err:  # the runs are safe on disk; a plot failing must not hide them
            log.warning("the sweep report could not be written (%s)", err)
            return
        print(f"report: {report}")


def print_grid(runs: list, grid: Grid) -> Grid | None:
    """Print the runs as `grid`'s table; where they do not form one, say why and return None."""
    try:
        table = grid_table(runs, grid)
    except ValueError as err:
        log.warning("no grid %s,%s: %s", grid.rows, grid.columns, err)
        return None
    print(f"\n{grid.rows} × {grid.columns}:\n{table}")
    return grid


def wandb_offline_line(sweep_dir: Path) -> str | None:
    """One line when the sweep's jobs logged W&B runs offline: how many, and the command that
    uploads them all (`wandb sync` takes run dirs; each job keeps its own under
    `<job dir>/wandb/`, so the sweep dir alone names none)."""
    found = sorted(Path(sweep_dir).glob("*/wandb/offline-run-*"))
    if not found:
        return None
    where = shlex.quote(str(Path(sweep_dir).resolve()))
    return (
        f"W&B: offline, {len(found)} runs; upload them with: "
        f"wandb sync {where}/*/wandb/offline-run-*"
    )


def sweep_rows(runs: list) -> tuple[list[str], list[str], list[list[str]]]:
    """(the keys that differ, the column heads, one row of cells per group) of a sweep's runs.

    Cells are mean ± sample std (ddof = 1, as in the report) over the completed runs of a group
    (its seeds), the mean alone for a group of one; the `runs` cell counts the others by status
    (`2 (+1 diverged)`). Each objective metric has a column of its own (`objective: <metric>`):
    a group's value sits in its own metric's column, so no column mixes two metrics.
    """
    groups, keys = group_runs(runs)
    objectives = sorted(objective_names(runs))
    present = {k for r in runs for k in r.summary.metrics}
    shown = [k for k in SHOWN if k in present]
    heads = ["group", "runs", *(f"objective: {m}" for m in objectives), *shown]
    rows = []
    for name, members in groups.items():
        done = [r for r in members if r.completed]
        other = sorted({r.summary.status for r in members if not r.completed})
        failed = len(members) - len(done)
        count = f"{len(done)}" + (f" (+{failed} {', '.join(other)})" if failed else "")
        values = [
            [r.summary.objective.value for r in done if _objective(r) == m] for m in objectives
        ]
        cells = [fmt(*mean_std(v)) if v else "" for v in values]
        cells += [fmt(*mean_std([r.summary.metrics.get(k) for r in done])) for k in shown]
        rows.append([name, count, *cells])
    return [k.removeprefix("choice:") for k in keys], heads, rows


def _objective(run) -> str | None:
    return run.summary.objective.name if run.summary.objective is not None else None


def objective_names(runs: list) -> set[str]:
    """The objective metrics of the runs (`eval/val/global/acc`, ...)."""
    return {
        r.summary.objective.name
        for r in runs
        if r.summary.objective is not None and r.summary.objective.name
    }


BACKDOOR = {
    "attack/backdoor_asr": "the global model on the pooled test set",
    "attack/backdoor_asr_personal": "each honest client's own model on its test split, over "
    "clients",
}


def population(metric: str) -> str | None:
    """What an `eval/` metric (or a backdoor's success rate) measures, in words; None for other
    metrics."""
    if metric in BACKDOOR:
        return (
            f"{BACKDOOR[metric]}: the share of its inputs outside the attack's target class "
            "classified as the target once triggered"
        )
    if not metric.startswith("eval/"):
        return None
    val = metric.startswith("eval/val/")
    split = "validation" if val else "test"
    if metric.endswith("/global/acc"):
        where = (
            "the union of the clients' validation splits"
            if val
            else "the pooled test set (the dataset's own test split; the union of the clients' "
            "test splits where it has none)"
        )
        return f"the global model on {where}"
    if "/global/client_acc" in metric:
        return f"the global model on each client's {split} split, over clients"
    if "/personal/" in metric:
        return f"each client's own model on its {split} split, over clients"
    if "/group/" in metric:
        return f"the client groups' mean {split} accuracies"
    return f"the {split} data"


def multimodal(runs: list) -> tuple[bool, Any]:
    """(whether a run is on `partition=multimodal`, its `group_ratio` where recorded)."""
    for r in runs:
        part = (r.summary.config or {}).get("partition")
        part = part if isinstance(part, dict) else {}
        if r.summary.choices.get("partition") == "multimodal" or str(
            part.get("_target_", "")
        ).endswith(".Multimodal"):
            return True, part.get("group_ratio")
    return False, None


def sweep_notes(heads: list[str], runs: list) -> list[str]:
    """The lines under the table: the data each column measures (the objective, measured on
    validation data, and the test columns do not measure the same population), and on the
    multimodal split how validation and test weigh the two client groups."""
    metrics = [h.removeprefix("objective: ") for h in heads[2:]]
    notes = [f"{m}: {population(m)}" for m in dict.fromkeys(metrics) if population(m)]
    on_multimodal, ratio = multimodal(runs)
    if on_multimodal:
        weights = f"{ratio} : 1" if ratio is not None else "group_ratio : 1"
        notes.append(
            f"partition=multimodal: the validation splits weigh the majority and minority "
            f"clients' classes {weights} (their client counts); a dataset's own test split "
            "holds every class in the dataset's proportions, so the objective and the test "
            "columns weigh the two groups differently"
        )
    return notes


def sweep_title(sweep_dir: Path, runs: list, keys: list[str], groups: int) -> str:
    """`sweep DIR: 6 runs in 3 groups, differing in algorithm`; a sweep of seeds alone says so."""
    plural = "group" if groups == 1 else "groups"
    if keys:
        differ = f"differing in {', '.join(keys)}"
    elif len({(r.summary.config or {}).get("seed") for r in runs}) > 1:
        differ = "differing only in the seed"
    else:
        differ = "differing in nothing"
    return f"sweep {sweep_dir}: {len(runs)} runs in {groups} {plural}, {differ}"


def head_text(head: str) -> str:
    """A column head in words with its metric key under it (`objective` first where it is)."""
    metric = head.removeprefix("objective: ")
    prefix = "objective: " if metric != head else ""
    title = metric_title(metric)
    return f"{prefix}{title}\n({metric})" if title != metric else head


def print_sweep_table(runs: list, sweep_dir: Path) -> None:
    """The grouped table of a sweep's runs (rich), titled with what the groups differ in, with
    the data each column measures, the groups' warnings and whether their clients held the
    same data under it."""
    from rich.console import Console
    from rich.table import Table

    keys, heads, rows = sweep_rows(runs)
    table = Table(
        title=sweep_title(sweep_dir, runs, keys, len(rows)),
        caption="mean ± sample std (ddof = 1) over the seeds of each group (one run: its value)",
    )
    for i, head in enumerate(heads):
        table.add_column(head_text(head), justify="left" if i == 0 else "right")
    for row in rows:
        table.add_row(*row)
    console = Console(file=sys.stdout, width=max(120, Console().width))
    console.print(table)
    groups, _ = group_runs(runs)
    for note in sweep_notes(heads, runs) + group_warnings(groups) + data_differences(groups):
        console.print(note, highlight=False, soft_wrap=True)
