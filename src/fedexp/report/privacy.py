"""DP-FedAvg's privacy budget in the report: the final ε per group (a table, mean ± sample std
over the completed seeds) and a figure of ε vs round beside accuracy vs ε.

`privacy/epsilon` is the accountant's ε at `algorithm.delta` after the rounds so far (see
docs/dp_fedavg.md). A run without noise or without clipping has no guarantee: its ε is inf,
written as `null` in metrics.jsonl and summary.json; the table says `inf` and the figure leaves
it out (the report's notes say so).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from fedexp.report.plots import (
    ACCURACY,
    _band,
    _column,
    _legend_outside,
    _pyplot,
    _save,
    curve,
    finite,
    integer_rounds,
    mean_std,
    palette,
    styles,
)

EPSILON = "privacy/epsilon"
ACC = "eval/global/acc"


def final_epsilons(runs) -> list[float]:
    """The completed runs' final ε (inf where summary.json holds null); runs that do not record
    ε are left out."""
    out = []
    for run in runs:
        if run.completed and EPSILON in run.summary.metrics:
            value = run.summary.metrics[EPSILON]
            out.append(float(value) if finite(value) else math.inf)
    return out


def records_epsilon(runs) -> bool:
    """Whether any of the runs logged ε (in summary.json or a round of metrics.jsonl)."""
    return any(EPSILON in r.summary.metrics or any(EPSILON in row for row in r.rows) for r in runs)


def epsilon_column(groups: dict[str, list]) -> list[str]:
    """Per group its final ε: mean ± sample std of the finite ones, `inf` when every completed
    run's ε is inf, `–` without one."""
    values = {name: final_epsilons(runs) for name, runs in groups.items()}
    cells = _column([mean_std(v) for v in values.values()], digits=3)
    for i, v in enumerate(values.values()):
        infinite = sum(math.isinf(e) for e in v)
        if infinite and infinite == len(v):
            cells[i] = "inf"
        elif infinite:
            cells[i] += f" ({infinite} of {len(v)} runs inf)"
    return cells


def privacy_table(groups: dict[str, list], flatten) -> list[str]:
    """The ε table (Markdown lines) of the groups that record ε; [] when none does."""
    shown = {name: runs for name, runs in groups.items() if records_epsilon(runs)}
    if not shown:
        return []
    accuracy = _column(
        [mean_std([r.summary.metrics.get(ACC) for r in g if r.completed]) for g in shown.values()]
    )
    epsilon = epsilon_column(shown)
    lines = [f"| group | runs | δ | final ε | {ACC} |", "|---|---|---|---|---|"]
    for i, (name, runs) in enumerate(shown.items()):
        deltas = {flatten(dict(r.summary.config)).get("algorithm.delta") for r in runs}
        delta = ", ".join(sorted(f"{d:g}" if finite(d) else "–" for d in deltas))
        done = sum(r.completed for r in runs)
        cells = [name, str(done), delta, epsilon[i], accuracy[i]]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def privacy_notes(groups: dict[str, list]) -> list[str]:
    """What the ε table and figure leave out, one line each."""
    having = [n for n, g in groups.items() if records_epsilon(g)]
    if not having:
        return []
    lines = []
    others = [n for n in groups if n not in having]
    if others:
        lines.append(f"`{EPSILON}`: not recorded by {'; '.join(others)} (no privacy accounting)")
    infinite = [n for n in having if not any(r.series(EPSILON) for r in groups[n])]
    if infinite:
        lines.append(
            f"`{EPSILON}`: inf (no noise or no clipping) in {'; '.join(infinite)}: "
            "not drawn in privacy.png"
        )
    return lines


def plot_privacy(groups: dict[str, list], path: Path) -> bool:
    """ε vs round (mean ± std over seeds) and accuracy vs ε (each evaluated round where both are
    finite: the mean ε against the mean accuracy ± std); False when no run has a finite ε."""
    drawn = {n: g for n, g in groups.items() if any(r.series(EPSILON) for r in g)}
    if not drawn:
        return False
    plt, colours, style = _pyplot(), palette(list(groups)), styles(list(groups))
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4), layout="constrained")
    index = {name: i for i, name in enumerate(groups)}
    measured = set()
    for name, runs in drawn.items():
        slot = (index[name], len(groups))
        rounds, eps, eps_std = curve(runs, EPSILON)
        _band(left, rounds, eps, eps_std, name, colours[name], style[name], slot)
        metric = next((m for m in ACCURACY if any(r.series(m) for r in runs)), None)
        if metric is None:
            continue
        measured.add(ACCURACY[metric])
        acc_rounds, acc, acc_std = curve(runs, metric)
        at = dict(zip(rounds.tolist(), eps))
        keep = [j for j, t in enumerate(acc_rounds.tolist()) if t in at and np.isfinite(acc[j])]
        if keep:
            x = np.array([at[int(acc_rounds[j])] for j in keep])
            _band(right, x, acc[keep], acc_std[keep], name, colours[name], style[name], slot)
    left.set(xlabel="round", ylabel="ε", title=f"privacy budget ({EPSILON})")
    integer_rounds(left)
    which = ", ".join(sorted(measured)) or "accuracy"
    right.set(
        xlabel="ε", ylabel="test accuracy", title=f"accuracy ({which}) vs ε, each evaluated round"
    )
    for ax in (left, right):
        ax.grid(alpha=0.3)
    _legend_outside(fig, [left, right])
    return _save(plt, fig, path, True)
