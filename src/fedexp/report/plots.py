"""The report's statistics and figures: one colour, marker and line style per group in every
figure (identical curves stay visible: hollow markers of different shapes at staggered rounds,
different dashes), legends outside the axes, integer ticks on round axes, single-round metrics as
points with error bars, accuracy panels on one y-axis with `sharey`.

Spread is the sample standard deviation over a group's seeds (ddof = 1); a group with one run has
none (NaN), and then no band or error bar is drawn.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from pathlib import Path

import numpy as np

ACCURACY = {
    "eval/global/acc": "global model, pooled test set",
    "eval/personal/acc_mean": "personal models, mean over clients",
}
LOSS = {
    "eval/global/loss": "global model, pooled test set",
    "eval/personal/loss_mean": "personal models, mean over clients",
}
# single-round accuracies drawn as points: key -> panel title
FINAL_ACCURACY = {
    "eval/global/acc": "global model, pooled test",
    "eval/global/client_acc_mean": "global model, client mean",
    "eval/personal/acc_mean": "personal models, client mean",
}
# MIA metric -> (panel title, the value of an attack that guesses)
MIA = {
    "privacy/mia_acc": ("attack accuracy", 0.5),
    "privacy/mia_auc": ("ROC AUC", 0.5),
    "privacy/mia_tpr@1%fpr": ("TPR at 1% FPR", 0.01),
    "privacy/mia_tpr@0.1%fpr": ("TPR at 0.1% FPR", 0.001),
}


# ---- statistics ----------------------------------------------------------------------------------
def finite(value) -> bool:
    """A number that is neither None, NaN nor inf (a bool is not a number here)."""
    number = isinstance(value, int | float) and not isinstance(value, bool)
    return number and math.isfinite(value)


def mean_std(values: Sequence[float | None], ddof: int = 1) -> tuple[float, float]:
    """Mean and sample standard deviation (ddof = 1) of the finite values (None, NaN and inf
    left out); the std is NaN with fewer than ddof + 1 values, both are NaN with none."""
    arr = np.asarray([v for v in values if finite(v)], dtype=float)
    if arr.size == 0:
        return float("nan"), float("nan")
    std = float(arr.std(ddof=ddof)) if arr.size > ddof else float("nan")
    return float(arr.mean()), std


def curve(runs, metric: str, ddof: int = 1) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(rounds, mean, sample std) over the runs that logged `metric`; a diverged seed stops
    early (a round is averaged over the seeds that reached it; std NaN where only one did)."""
    series = [s for s in (r.series(metric) for r in runs) if s]
    rounds = np.array(sorted({t for s in series for t in s}), dtype=int)
    if not series:
        return rounds, np.array([]), np.array([])
    grid = np.array([[s.get(int(t), np.nan) for t in rounds] for s in series], dtype=float)
    with warnings.catch_warnings():  # a round no seed reached is NaN, not a warning
        warnings.simplefilter("ignore", RuntimeWarning)
        return rounds, np.nanmean(grid, axis=0), np.nanstd(grid, axis=0, ddof=ddof)


def fmt(mean: float, std: float, scale: float = 1.0, digits: int = 4, spread=True) -> str:
    """`mean ± std`; the mean alone without `spread` or when the std is NaN (one run)."""
    if np.isnan(mean):
        return "–"
    if not spread or np.isnan(std):
        return f"{mean * scale:.{digits}f}"
    return f"{mean * scale:.{digits}f} ± {std * scale:.{digits}f}"


def _column(stats: list[tuple[float, float]], scale: float = 1.0, digits: int = 4) -> list[str]:
    """A table column; ± only where some group has a spread (no column of `± 0`)."""
    spread = any(np.isfinite(s) and s > 0 for _, s in stats)
    return [fmt(m, s, scale, digits, spread) for m, s in stats]


# ---- drawing -------------------------------------------------------------------------------------
def palette(names: Sequence[str]) -> dict[str, tuple]:
    """One colour per group name, the same in every figure (tab10, tab20, then viridis)."""
    import matplotlib

    n = len(names)
    if n <= 10:
        colours = [matplotlib.colormaps["tab10"](i) for i in range(n)]
    elif n <= 20:
        colours = [matplotlib.colormaps["tab20"](i) for i in range(n)]
    else:
        colours = [matplotlib.colormaps["viridis"](i / (n - 1)) for i in range(n)]
    return dict(zip(names, colours))


MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
LINESTYLES = ("-", "--", "-.", ":")


def styles(names: Sequence[str]) -> dict[str, tuple[str, str]]:
    """One (marker, line style) pair per group name, distinct for up to 32 groups: the i-th
    group gets marker i mod 8 and line style (i + i // 8) mod 4."""
    return {
        name: (MARKERS[i % len(MARKERS)], LINESTYLES[(i + i // len(MARKERS)) % len(LINESTYLES)])
        for i, name in enumerate(names)
    }


def integer_rounds(ax) -> None:
    """Round axes tick at whole rounds only, a lone round included (min_n_ticks=1: a view of
    0.95 to 1.05 gets the tick 1, not 0.96, 0.98, ...)."""
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(plt, fig, path: Path, drawn: bool) -> bool:
    """Write the figure when something was drawn (legends outside the axes included); always
    free it."""
    if drawn:
        fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return drawn


def wrap(text: str, width: int) -> str:
    """`text` in lines of at most `width` characters (a long label in a legend or tick)."""
    import textwrap

    return "\n".join(textwrap.wrap(text, width, break_long_words=True)) or text


LEGEND_WRAP = 40  # characters a legend line holds


def _legend_outside(fig, axes) -> None:
    """One legend for the figure, outside the panels on the right (each group once): the
    constrained layout gives it room of its own, and the figure widens by the legend's width,
    so it never covers or squeezes a panel, however long the labels."""
    seen: dict[str, object] = {}
    for ax in axes:
        for handle, text in zip(*ax.get_legend_handles_labels()):
            seen.setdefault(text, handle)
    if seen:
        labels = [wrap(text, LEGEND_WRAP) for text in seen]
        chars = max(len(line) for text in labels for line in text.splitlines())
        width, height = fig.get_size_inches()
        fig.set_size_inches(width + 0.6 + 0.065 * chars, height)
        fig.legend(
            list(seen.values()), labels, loc="outside right upper", fontsize=8, frameon=False
        )


def _band(ax, x, mean, std, name: str, colour, style, slot=(0, 1)) -> None:
    """The mean line in the group's (marker, line style) and the ± std band where there is one.
    Markers are hollow, on about 10 points, staggered by the group's `slot` (index, number of
    groups) so identical curves of different groups show their markers at different rounds."""
    index, count = slot
    step = max(1, len(x) // 10, min(count, len(x) // 3))
    marker, linestyle = style
    ax.plot(
        x,
        mean,
        label=name,
        color=colour,
        marker=marker,
        linestyle=linestyle,
        markevery=(index % step, step),
        markerfacecolor="none",
        markersize=6,
    )
    spread = np.isfinite(std)
    if spread.any():
        ax.fill_between(x, mean - std, mean + std, where=spread, alpha=0.2, color=colour, lw=0)


def plot_vs_round(
    groups, path: Path, metrics: dict[str, str], ylabel: str, hline=None, sharey=False
) -> bool:
    """One panel per metric (key -> title); a mean ± std line per group (`sharey`: the panels
    share one y-axis). False if no data."""
    present = {
        m: t for m, t in metrics.items() if any(r.series(m) for g in groups.values() for r in g)
    }
    if not present:
        return False
    plt, colours, style = _pyplot(), palette(list(groups)), styles(list(groups))
    size = (5.5 * len(present), 4)
    fig, axes = plt.subplots(
        1, len(present), figsize=size, squeeze=False, sharey=sharey, layout="constrained"
    )
    for ax, (metric, title) in zip(axes[0], present.items()):
        for i, (name, runs) in enumerate(groups.items()):
            rounds, mean, std = curve(runs, metric)
            if mean.size:
                _band(ax, rounds, mean, std, name, colours[name], style[name], (i, len(groups)))
        if hline is not None:
            ax.axhline(hline, color="grey", linestyle="--", linewidth=1)
        ax.set(xlabel="round", ylabel=ylabel, title=title)
        integer_rounds(ax)
        ax.grid(alpha=0.3)
    _legend_outside(fig, list(axes[0]))
    return _save(plt, fig, path, True)


def plot_acc_vs_comm(groups, path: Path) -> bool:
    """Accuracy against cumulative up + down bits (comm/*_total at the same rounds)."""
    plt, colours, style = _pyplot(), palette(list(groups)), styles(list(groups))
    fig, ax = plt.subplots(figsize=(6, 4), layout="constrained")
    drawn, n = False, len(groups)
    for i, (name, runs) in enumerate(groups.items()):
        metric = next((m for m in ACCURACY if any(r.series(m) for r in runs)), None)
        if metric is None:
            continue
        rounds, mean, std = curve(runs, metric)
        up, down = curve(runs, "comm/up_bits_total"), curve(runs, "comm/down_bits_total")
        comm = dict(zip(up[0].tolist(), up[1]))
        for t, bits in zip(down[0].tolist(), down[1]):
            comm[t] = comm.get(t, 0.0) + bits
        keep = [i for i, t in enumerate(rounds.tolist()) if t in comm]
        if not keep:
            continue
        megabytes = np.array([comm[int(rounds[i])] for i in keep]) / 8e6
        text = f"{name} ({ACCURACY[metric]})"
        _band(ax, megabytes, mean[keep], std[keep], text, colours[name], style[name], (i, n))
        drawn = True
    if drawn:
        ax.set(xlabel="cumulative communication, up + down (MB)", ylabel="test accuracy")
        ax.grid(alpha=0.3)
        _legend_outside(fig, [ax])
    return _save(plt, fig, path, drawn)


def _group_ticks(ax, names: list[str]) -> None:
    """Group names under the panel, long ones over several lines (the figure grows to hold
    them)."""
    wrapped = [wrap(name, 28) for name in names]
    lines = max((text.count("\n") + 1 for text in wrapped), default=1)
    fig = ax.figure
    width, height = fig.get_size_inches()
    fig.set_size_inches(width, max(height, 3.2 + 0.16 * lines))
    ax.set_xticks(range(len(names)), wrapped, rotation=20, ha="right", fontsize=8)
    ax.set_xlim(-0.5, len(names) - 0.5)
    ax.grid(alpha=0.3, axis="y")


def client_values(runs, kind: str) -> list[float]:
    """The completed runs' final per-client accuracies of `kind`, pooled; clients without a
    value (null or NaN: an empty local test split, or none at all) are left out."""
    values = [a for r in runs if r.completed for a in r.summary.client_acc.get(kind) or []]
    return [float(a) for a in values if isinstance(a, (int, float)) and math.isfinite(a)]


def plot_client_boxes(groups, path: Path, sharey: bool = False) -> bool:
    """Per-client final accuracies (summary.json client_acc), pooled over a group's seeds
    (`sharey`: the personal and global panels share one y-axis); False when no run has a
    finite one."""
    kinds = [k for k in ("personal", "global") if any(client_values(g, k) for g in groups.values())]
    if not kinds:
        return False
    plt, colours = _pyplot(), palette(list(groups))
    width = max(5, 1.2 * len(groups))
    size = (width * len(kinds), 4)
    fig, axes = plt.subplots(
        1, len(kinds), figsize=size, squeeze=False, sharey=sharey, layout="constrained"
    )
    for ax, kind in zip(axes[0], kinds):
        names, data = [], []
        for name, runs in groups.items():
            values = client_values(runs, kind)
            if values:
                names.append(name)
                data.append(values)
        boxes = ax.boxplot(
            data, positions=range(len(names)), patch_artist=True, medianprops={"color": "black"}
        )
        for box, name in zip(boxes["boxes"], names):
            box.set(facecolor=colours[name], alpha=0.6)
        _group_ticks(ax, names)
        ax.set(ylabel="client test accuracy", title=f"{kind} model, per client (final)")
    return _save(plt, fig, path, True)


def plot_points(
    groups,
    path: Path,
    panels: dict[str, tuple[str, float | None]],
    ylabel: str | None = None,
    sharey: bool = False,
) -> bool:
    """Single-round metrics (final accuracy, MIA): one panel per metric (key -> (title, dashed
    reference line or None)); each group's final value over its completed seeds as a point with
    a mean ± sample-std error bar, in the group's colour (`ylabel`: one axis label for every
    panel, else each panel's title; `sharey`: one y-axis for all). False if no run has any
    metric."""
    finals = {
        m: [[r.summary.metrics.get(m) for r in g if r.completed] for g in groups.values()]
        for m in panels
    }
    present = [m for m, per in finals.items() if any(finite(v) for g in per for v in g)]
    if not present:
        return False
    plt, colours, style = _pyplot(), palette(list(groups)), styles(list(groups))
    size = (max(4.5, 1.2 * len(groups)) * len(present), 4)
    fig, axes = plt.subplots(
        1, len(present), figsize=size, squeeze=False, sharey=sharey, layout="constrained"
    )
    for ax, metric in zip(axes[0], present):
        title, reference = panels[metric]
        for i, (name, values) in enumerate(zip(groups, finals[metric])):
            mean, std = mean_std(values)
            if np.isnan(mean):
                continue
            err = None if np.isnan(std) else [std]
            marker = style[name][0]
            ax.errorbar([i], [mean], yerr=err, fmt=marker, capsize=4, color=colours[name])
        if reference is not None:
            ax.axhline(reference, color="grey", linestyle="--", linewidth=1)
        _group_ticks(ax, list(groups))
        ax.set(ylabel=ylabel or title, title=f"{title} (final)")
    return _save(plt, fig, path, True)


def plot_mia(groups, path: Path) -> bool:
    """The final MIA metrics as points with error bars; a dashed line at chance."""
    return plot_points(groups, path, MIA)


def plot_final_accuracy(groups, path: Path, sharey: bool = False) -> bool:
    """The final accuracies as points with error bars (`sharey`: the panels on one y-axis)."""
    panels = {k: (t, None) for k, t in FINAL_ACCURACY.items()}
    return plot_points(groups, path, panels, ylabel="test accuracy", sharey=sharey)
