"""A sweep over two keys as one table: `python -m fedexp.report <sweep dir> --grid
aggregator,attack --baseline attack=none`.

One row per value of the first key, one column per value of the second, each cell a final metric
(`eval/global/acc` unless another is named) as mean ± sample std (ddof = 1) over the completed
seeds of that pair. With a baseline (a value of the column key, e.g. `attack=none`) its column
comes first and every other cell adds Δ, its mean minus the baseline cell's mean in the same row
(a drop is negative). Where a cell's runs measured a backdoor (`attack/backdoor_asr`) the cell
adds its success rate. Runs that differ in anything but the two keys and the seed are refused:
they would be averaged into one cell.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from fedexp.report.plots import fmt, mean_std
from fedexp.report.runs import Run, flatten, grouping_keys

ASR = "attack/backdoor_asr"
DIGITS = 3


@dataclass(frozen=True)
class Grid:
    """What `--grid ROW,COL [--baseline COL=VALUE] [--grid-metric M]` asks for."""

    rows: str
    columns: str
    metric: str = "eval/global/acc"
    baseline: str | None = None  # a value of `columns`

    @classmethod
    def parse(cls, keys: str, baseline: str | None = None, metric: str | None = None) -> Grid:
        """`aggregator,attack` and `attack=none`; a malformed value is a ValueError."""
        parts = [k.strip() for k in keys.split(",")]
        if len(parts) != 2 or not all(parts) or parts[0] == parts[1]:
            raise ValueError(f"--grid {keys}: two different keys, ROW,COL (aggregator,attack)")
        value = None
        if baseline is not None:
            key, sep, value = baseline.partition("=")
            if not sep or key.strip() != parts[1] or not value.strip():
                raise ValueError(
                    f"--baseline {baseline}: a value of the column key, {parts[1]}=VALUE"
                )
            value = value.strip()
        return cls(parts[0], parts[1], metric or cls.metric, value)


def value_of(run: Run, key: str) -> str | None:
    """The run's value of `key` as text: its group choice (`attack`) or config value
    (`algorithm.mu`); None where it has neither."""
    if key in run.summary.choices:
        return str(run.summary.choices[key])
    flat = flatten(dict(run.summary.config))
    return str(flat[key]) if key in flat else None


def _natural(run: Run) -> tuple:
    """Sort key of a run dir: its path with numbers by size (a sweep's job 2 before job 10)."""
    return tuple(
        (0, int(p), "") if p.isdigit() else (1, 0, p) for p in re.split(r"(\d+)", str(run.path))
    )


def _ordered(values: list[str], first: str | None) -> list[str]:
    values = list(dict.fromkeys(values))
    return [first, *(v for v in values if v != first)] if first in values else values


def cells(runs: list[Run], grid: Grid) -> tuple[list[str], list[str], dict[tuple, list[Run]]]:
    """(row values, column values, (row, column) -> its runs), in the order the sweep ran them
    (the baseline column first). Raises ValueError where a run lacks a key or the runs differ
    in another key too."""
    extra = [
        k.removeprefix("choice:")
        for k in grouping_keys(runs)
        if k.removeprefix("choice:") not in (grid.rows, grid.columns)
    ]
    if extra:
        raise ValueError(
            f"the runs differ in {', '.join(extra)} besides {grid.rows} and {grid.columns}: "
            f"a cell would average them; give the runs of one {extra[0]} only"
        )
    table: dict[tuple, list[Run]] = {}
    for run in sorted(runs, key=_natural):
        pair = (value_of(run, grid.rows), value_of(run, grid.columns))
        if None in pair:
            missing = grid.rows if pair[0] is None else grid.columns
            raise ValueError(f"{run.path}: no {missing} in its summary.json")
        table.setdefault(pair, []).append(run)
    rows = _ordered([r for r, _ in table], None)
    columns = _ordered([c for _, c in table], grid.baseline)
    if grid.baseline is not None and grid.baseline not in columns:
        raise ValueError(f"--baseline {grid.columns}={grid.baseline}: no run has it")
    return rows, columns, table


def _stats(runs: list[Run], metric: str) -> tuple[float, float]:
    return mean_std([r.summary.metrics.get(metric) for r in runs if r.completed])


def cell_text(runs: list[Run], metric: str, base: float | None) -> str:
    """`0.456 ± 0.030 (Δ -0.416)`, `ASR 0.987 ± 0.014` where measured, `(+1 diverged)`."""
    if not runs:
        return ""
    mean, std = _stats(runs, metric)
    text = fmt(mean, std, digits=DIGITS)
    if base is not None and math.isfinite(mean) and math.isfinite(base):
        delta = round(mean - base, DIGITS) + 0.0  # no `-0.000` for equal means
        text += f" (Δ {delta:+.{DIGITS}f})"
    asr = _stats(runs, ASR)
    if math.isfinite(asr[0]):
        text += f", ASR {fmt(*asr, digits=DIGITS)}"
    other = [r.summary.status for r in runs if not r.completed]
    if other:
        text += f" (+{len(other)} {', '.join(sorted(set(other)))})"
    return text


def grid_table(runs: list[Run], grid: Grid) -> str:
    """The grid as a Markdown table, with a line under it saying what the cells hold."""
    rows, columns, table = cells(runs, grid)
    head = [grid.rows, *(f"{grid.columns}={c}" for c in columns)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        base = None
        if grid.baseline is not None:
            base = _stats(table.get((row, grid.baseline), []), grid.metric)[0]
        texts = [
            cell_text(table.get((row, c), []), grid.metric, None if c == grid.baseline else base)
            for c in columns
        ]
        lines.append("| " + " | ".join([row, *texts]) + " |")
    return "\n".join([*lines, "", caption(grid)])


def caption(grid: Grid) -> str:
    delta = (
        f"; Δ: the cell's mean minus the mean of {grid.columns}={grid.baseline} in its row "
        "(a drop is negative)"
        if grid.baseline is not None
        else ""
    )
    return (
        f"`{grid.metric}`: mean ± sample std (ddof = 1) over the completed seeds of each cell "
        f"(one run: its value){delta}; ASR: `{ASR}` where the runs measured it."
    )


def grid_lines(runs: list[Run], grid: Grid) -> list[str]:
    """The grid section of report.md."""
    title = f"## Grid: {grid.rows} × {grid.columns}"
    return [title, "", grid_table(runs, grid), ""]
