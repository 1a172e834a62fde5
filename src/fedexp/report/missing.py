"""What the report leaves out, one line each, for its "Left out" section.

A valid run dir may lack a quantity (FRL without local test splits records no per-client
accuracy), hold None/NaN for it, stop early (diverged, interrupted) or log no round at all; the
figures and tables skip what is not there, and these lines say what was skipped and for whom.
"""

from __future__ import annotations

from fedexp.core.summary import REFUSED
from fedexp.report.plots import ACCURACY, client_values, finite

COMM = ("comm/up_bits_total", "comm/down_bits_total")
# per-round curves whose absence from some groups is worth a line
CURVES = (*ACCURACY, "eval/group/gap")
KINDS = ("personal", "global")


def comm_total(run) -> float | None:
    """Up + down bits of the run's summary; None when it records neither."""
    parts = [run.summary.metrics.get(k) for k in COMM]
    if not any(finite(p) for p in parts):
        return None
    return float(sum(p for p in parts if finite(p)))


def _names(names: list[str], of: int = 0) -> str:
    """The group names, `; `-separated (labels hold commas); `every group` when they are all
    `of` groups (more than one)."""
    return "every group" if of > 1 and len(names) == of else "; ".join(names)


def _column_notes(finished: dict[str, list], metric: str, value) -> list[str]:
    """`metric` absent, non-finite or partly there in the completed runs of each group."""
    absent, nonfinite, partial, of = [], [], [], len(finished)
    for name, runs in finished.items():
        count = sum(finite(value(r)) for r in runs)
        if count == len(runs):
            continue
        if count:
            partial.append(f"{count} of {len(runs)} completed runs of {name}")
        elif metric not in COMM and any(metric in r.summary.metrics for r in runs):
            nonfinite.append(name)
        else:
            absent.append(name)
    shown = "communication" if metric in COMM else f"`{metric}`"
    lines = []
    if absent:
        lines.append(f"{shown}: not recorded by {_names(absent, of)} (– in the table)")
    if nonfinite:
        lines.append(f"{shown}: null/NaN in {_names(nonfinite, of)} (– in the table)")
    if partial:
        lines.append(f"{shown}: recorded by {'; '.join(partial)} (the mean of those)")
    return lines


def left_out(groups: dict[str, list], columns: list[str]) -> list[str]:
    """The lines: groups without a completed run, final-table `columns` (and communication) a
    group lacks, per-client accuracies, curves some groups lack, runs without per-round metrics."""
    lines = []
    done = {name: [r for r in runs if r.completed] for name, runs in groups.items()}
    for name, runs in groups.items():
        if not done[name]:
            statuses = ", ".join(sorted({r.summary.status for r in runs}))
            lines.append(
                f"{name}: no completed run ({statuses}): left out of the final values (tables, "
                "points, box plots); its curves show the rounds it reached"
            )
    finished = {name: runs for name, runs in done.items() if runs}
    for metric in columns:
        lines += _column_notes(finished, metric, lambda r, m=metric: r.summary.metrics.get(m))
    lines += _column_notes(finished, COMM[0], comm_total)
    no_clients = [
        n for n, runs in finished.items() if not any(client_values(runs, k) for k in KINDS)
    ]
    if no_clients:
        box = "no box plot" if len(no_clients) == len(finished) else "no box"
        shown = _names(no_clients, len(finished))
        lines.append(f"per-client accuracy: not recorded by {shown} ({box})")
    for metric in CURVES:
        having = [n for n, runs in groups.items() if any(r.series(metric) for r in runs)]
        if having and len(having) < len(groups):
            others = [n for n in groups if n not in having]
            lines.append(f"`{metric}` vs round: not recorded by {_names(others)}")
    for name, runs in groups.items():
        for run in runs:
            if run.summary.status not in REFUSED and not any("round" in r for r in run.rows):
                lines.append(
                    f"{name}: `{run.path}` has no per-round metrics (metrics.jsonl missing or "
                    "empty): not in the curves"
                )
    return lines
