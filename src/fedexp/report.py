"""`python -m fedexp.report <run or multirun dirs...> [--out DIR]`: compare runs in one report.

Reads `summary.json` and `metrics.jsonl` of every run found under the given directories, groups
the runs by the config values that differ between them (found automatically; the seed is left
out, so a group's runs are its seeds) and writes `report.md` with PNG plots: accuracy vs round
(mean ± std band over seeds), the final table (mean ± std), client-accuracy box plots, accuracy
vs cumulative communication, the majority/minority gap vs round, and the final MIA metrics
(points with mean ± std error bars per group) where present.
The std is numpy's (population, ddof=0) over the seeds of a group.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fedexp.core.summary import RunSummary

# config keys that never explain a difference in results (or are the seeds being averaged)
IGNORED = ("seed", "paths", "progress", "device", "resume", "checkpoint_every", "logger")
IGNORED += ("objective", "hparams_search")
# specialisations the defaults list derives from other choices (algorithm, dataset, experiment)
IGNORED += (
    "paper",
    "paper_algorithm",
    "experiment_algorithm",
    "algorithm_dataset",
    "debug_algorithm",
)
IGNORED += ("attack_paper@attack",)
# groups in Hydra's _global_ package: when one varies its name is the label, not its keys
GLOBAL_GROUPS = ("experiment", "debug")
ACCURACY = {"eval/global/acc": "global model", "eval/personal/acc_mean": "personal models"}
FINAL = (
    "eval/global/acc",
    "eval/global/client_acc_mean",
    "eval/personal/acc_mean",
    "eval/personal/acc_min",
    "eval/group/gap",
    "privacy/mia_acc",
    "privacy/mia_auc",
    "privacy/mia_tpr@1%fpr",
    "privacy/mia_tpr@0.1%fpr",
)
# MIA metric -> (panel title, the value of an attack that guesses)
MIA = {
    "privacy/mia_acc": ("attack accuracy", 0.5),
    "privacy/mia_auc": ("ROC AUC", 0.5),
    "privacy/mia_tpr@1%fpr": ("TPR at 1% FPR", 0.01),
    "privacy/mia_tpr@0.1%fpr": ("TPR at 0.1% FPR", 0.001),
}


@dataclass
class Run:
    path: Path
    summary: RunSummary
    rows: list[dict] = field(default_factory=list)

    @property
    def completed(self) -> bool:
        return self.summary.completed

    def series(self, metric: str) -> dict[int, float]:
        """round -> value of `metric` in metrics.jsonl (rounds where it was logged)."""
        return {
            int(r["round"]): float(r[metric])
            for r in self.rows
            if r.get(metric) is not None and "round" in r
        }


def find_runs(paths: Sequence[str | Path]) -> list[Run]:
    """Every run (a dir with summary.json) under `paths`, in path order."""
    runs, seen = [], set()
    for root in paths:
        for summary_path in sorted(Path(root).rglob("summary.json")):
            if summary_path.resolve() in seen:  # a run dir given inside its multirun dir
                continue
            seen.add(summary_path.resolve())
            try:
                summary = RunSummary.from_dict(json.loads(summary_path.read_text()))
            except (OSError, ValueError) as err:  # JSONDecodeError is a ValueError
                print(f"fedexp.report: skipping {summary_path} ({err})", file=sys.stderr)
                continue
            rows = []
            metrics = summary_path.parent / "metrics.jsonl"
            if metrics.exists():
                for line in metrics.read_text().splitlines():
                    try:
                        rows.append(json.loads(line))
                    except json.JSONDecodeError:
                        continue  # a half-written last line
            runs.append(Run(summary_path.parent, summary, rows))
    return runs


def flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    """Nested dicts -> {'a.b.c': value}; lists become their JSON text (hashable)."""
    if isinstance(node, dict):
        out: dict[str, Any] = {}
        for key, value in node.items():
            out.update(flatten(value, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: json.dumps(node) if isinstance(node, list) else node}


def _varies(values: list) -> bool:
    return len({json.dumps(v, sort_keys=True, default=str) for v in values}) > 1


def grouping_keys(runs: list[Run]) -> list[str]:
    """What the sweep varied: Hydra group choices ('algorithm') and config keys ('client.lr').

    A key under a varying choice (algorithm.mu when algorithm varies) is explained by the
    choice and left out; so is every key when a _global_ preset (experiment) varies.
    """
    choices = [r.summary.choices for r in runs]
    names = sorted({k for c in choices for k in c} - set(IGNORED))
    varying_choices = [k for k in names if _varies([c.get(k) for c in choices])]
    if any(g in varying_choices for g in GLOBAL_GROUPS):
        return [f"choice:{k}" for k in varying_choices]
    flat = [flatten(dict(r.summary.config)) for r in runs]
    keys = sorted({k for f in flat for k in f})
    varying = [
        k
        for k in keys
        if k.split(".")[0] not in IGNORED
        and k.split(".")[0] not in varying_choices
        and _varies([f.get(k) for f in flat])
    ]
    return [f"choice:{k}" for k in varying_choices] + varying


def label(run: Run, keys: list[str]) -> str:
    if not keys:
        return str(run.summary.choices.get("algorithm") or "runs")
    flat = flatten(dict(run.summary.config))
    parts = []
    for key in keys:
        if key.startswith("choice:"):
            name = key.removeprefix("choice:")
            parts.append(f"{name}={run.summary.choices.get(name)}")
        else:
            parts.append(f"{key}={flat.get(key)}")
    return ", ".join(parts)


def group_runs(runs: list[Run]) -> tuple[dict[str, list[Run]], list[str]]:
    keys = grouping_keys(runs)
    groups: dict[str, list[Run]] = {}
    for run in runs:
        groups.setdefault(label(run, keys), []).append(run)
    return dict(sorted(groups.items())), keys


# ---- aggregation ---------------------------------------------------------------------------------
def mean_std(values: Sequence[float]) -> tuple[float, float]:
    arr = np.asarray([v for v in values if v is not None], dtype=float)
    if arr.size == 0:
        return float("nan"), float("nan")
    return float(arr.mean()), float(arr.std())


def curve(runs: list[Run], metric: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(rounds, mean, std) over the runs that logged `metric`; a diverged seed stops early."""
    series = [s for s in (r.series(metric) for r in runs) if s]
    rounds = np.array(sorted({t for s in series for t in s}), dtype=int)
    if not series:
        return rounds, np.array([]), np.array([])
    grid = np.array([[s.get(int(t), np.nan) for t in rounds] for s in series], dtype=float)
    with warnings.catch_warnings():  # a round no seed reached is NaN, not a warning
        warnings.simplefilter("ignore", RuntimeWarning)
        return rounds, np.nanmean(grid, axis=0), np.nanstd(grid, axis=0)


def final_metrics(groups: dict[str, list[Run]]) -> list[str]:
    """The final-table columns: FINAL metrics and per-group accuracies any run reports."""
    present = {k for runs in groups.values() for r in runs for k in r.summary.metrics}
    per_group = sorted(
        k for k in present if k.startswith("eval/group/") and k.endswith("/acc_mean")
    )
    return [k for k in FINAL if k in present] + per_group


def fmt(mean: float, std: float, scale: float = 1.0, digits: int = 4) -> str:
    if np.isnan(mean):
        return "–"
    return f"{mean * scale:.{digits}f} ± {std * scale:.{digits}f}"


def final_table(groups: dict[str, list[Run]]) -> str:
    metrics = final_metrics(groups)
    head = ["group", "runs", "rounds", *metrics, "comm total (MB)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, runs in groups.items():
        done = [r for r in runs if r.completed]  # diverged/interrupted runs are counted only
        other = [r.summary.status for r in runs if not r.completed]
        count = f"{len(done)}" + (
            f" (+{len(other)} {', '.join(sorted(set(other)))})" if other else ""
        )
        cells = [
            name,
            count,
            fmt(*mean_std([r.summary.rounds_completed for r in done]), digits=0),
        ]
        for metric in metrics:
            cells.append(fmt(*mean_std([r.summary.metrics.get(metric) for r in done])))
        comm = [
            (r.summary.metrics.get("comm/up_bits_total") or 0)
            + (r.summary.metrics.get("comm/down_bits_total") or 0)
            for r in done
        ]
        cells.append(fmt(*mean_std(comm), scale=1 / 8e6, digits=2))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


# ---- plots ---------------------------------------------------------------------------------------
def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _band(ax, x, mean, std, name: str) -> None:
    (line,) = ax.plot(x, mean, label=name, marker="." if len(x) < 30 else None)
    ax.fill_between(x, mean - std, mean + std, alpha=0.2, color=line.get_color())


def plot_vs_round(groups, path: Path, metrics: dict[str, str], ylabel: str, hline=None) -> bool:
    """One panel per metric (key -> title); a mean ± std line per group. False if no data."""
    present = {
        m: t for m, t in metrics.items() if any(r.series(m) for g in groups.values() for r in g)
    }
    if not present:
        return False
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(present), figsize=(6 * len(present), 4), squeeze=False)
    for ax, (metric, title) in zip(axes[0], present.items()):
        for name, runs in groups.items():
            rounds, mean, std = curve(runs, metric)
            if mean.size:
                _band(ax, rounds, mean, std, name)
        if hline is not None:
            ax.axhline(hline, color="grey", linestyle="--", linewidth=1)
        ax.set(xlabel="round", ylabel=ylabel, title=title)
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return _save(plt, fig, path, True)


def _save(plt, fig, path: Path, drawn: bool) -> bool:
    """Write the figure when something was drawn; always free it."""
    if drawn:
        fig.tight_layout()
        fig.savefig(path, dpi=120)
    plt.close(fig)
    return drawn


def plot_acc_vs_comm(groups, path: Path) -> bool:
    """Accuracy against cumulative up + down bits (comm/*_total at the same rounds)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    drawn = False
    for name, runs in groups.items():
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
        _band(ax, megabytes, mean[keep], std[keep], f"{name} ({ACCURACY[metric]})")
        drawn = True
    if drawn:
        ax.set(xlabel="cumulative communication, up + down (MB)", ylabel="accuracy")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return _save(plt, fig, path, drawn)


def plot_client_boxes(groups, path: Path) -> bool:
    """Per-client final accuracies (summary.json client_acc), pooled over a group's seeds."""
    kinds = [
        k
        for k in ("personal", "global")
        if any(r.summary.client_acc.get(k) for g in groups.values() for r in g)
    ]
    if not kinds:
        return False
    plt = _pyplot()
    fig, axes = plt.subplots(
        1, len(kinds), figsize=(max(6, 1.5 * len(groups)) * len(kinds), 4), squeeze=False
    )
    for ax, kind in zip(axes[0], kinds):
        names, data = [], []
        for name, runs in groups.items():
            values = [a for r in runs if r.completed for a in r.summary.client_acc.get(kind, [])]
            if values:
                names.append(name)
                data.append(values)
        ax.boxplot(data)
        ax.set_xticks(range(1, len(names) + 1), names, rotation=20, ha="right", fontsize=8)
        ax.set(ylabel="client test accuracy", title=f"{kind} model, per client")
        ax.grid(alpha=0.3, axis="y")
    return _save(plt, fig, path, True)


def plot_mia(groups, path: Path) -> bool:
    """One panel per MIA metric: each group's final value over its completed seeds as a point
    with a mean ± std error bar; a dashed line at chance. False if no run has one."""
    finals = {
        m: [[r.summary.metrics.get(m) for r in g if r.completed] for g in groups.values()]
        for m in MIA
    }
    present = [
        m for m, per_group in finals.items() if any(v is not None for g in per_group for v in g)
    ]
    if not present:
        return False
    plt = _pyplot()
    width = max(4, 1.2 * len(groups))
    fig, axes = plt.subplots(1, len(present), figsize=(width * len(present), 4), squeeze=False)
    for ax, metric in zip(axes[0], present):
        (title, chance), stats = MIA[metric], [mean_std(v) for v in finals[metric]]
        ax.errorbar(range(len(groups)), *zip(*stats), fmt="o", capsize=4, linestyle="none")
        ax.axhline(chance, color="grey", linestyle="--", linewidth=1)
        ax.set_xticks(range(len(groups)), list(groups), rotation=20, ha="right", fontsize=8)
        ax.set(xlim=(-0.5, len(groups) - 0.5), ylabel=title, title=f"{title} (final)")
        ax.grid(alpha=0.3, axis="y")
    return _save(plt, fig, path, True)


# ---- the report ----------------------------------------------------------------------------------
def write_report(paths: Sequence[str | Path], out: str | Path) -> Path:
    """Write report.md and its PNGs into `out`; returns the path of report.md."""
    runs = find_runs(paths)
    if not runs:
        raise FileNotFoundError(f"no summary.json under {', '.join(map(str, paths))}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    groups, keys = group_runs(runs)
    shown = [k.removeprefix("choice:") for k in keys]
    md = [
        "# fedexp report",
        "",
        f"{len(runs)} runs in {len(groups)} groups from {', '.join(f'`{p}`' for p in paths)}.",
        f"Groups differ in: {', '.join(f'`{k}`' for k in shown) or 'nothing (one group)'}; "
        "mean ± std over the seeds of each group (population std).",
        "",
        "## Final metrics",
        "",
        final_table(groups),
        "",
    ]
    gap = {"eval/group/gap": "best - worst client group accuracy"}
    sections = [
        ("Accuracy vs round", "acc_vs_round.png", plot_vs_round, (ACCURACY, "accuracy")),
        ("Client accuracy distribution", "client_acc_box.png", plot_client_boxes, ()),
        ("Accuracy vs cumulative communication", "acc_vs_comm.png", plot_acc_vs_comm, ()),
        ("Majority/minority gap", "group_gap.png", plot_vs_round, (gap, "accuracy gap")),
        ("Membership inference", "mia_acc.png", plot_mia, ()),
    ]
    for title, filename, draw, extra in sections:
        if draw(groups, out / filename, *extra):
            md += [f"## {title}", "", f"![{title}]({filename})", ""]
    md += ["## Runs", "", "| group | status | run dir |", "|---|---|---|"]
    for name, group in groups.items():
        md += [f"| {name} | {r.summary.status} | `{r.path}` |" for r in group]
    report = out / "report.md"
    report.write_text("\n".join(md) + "\n")
    return report


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m fedexp.report", description=__doc__.splitlines()[0]
    )
    parser.add_argument("paths", nargs="+", help="run dirs or multirun dirs (searched recursively)")
    parser.add_argument("--out", help="output dir (default: <the one path>/report, or ./report)")
    args = parser.parse_args(argv)
    out = args.out or (Path(args.paths[0]) / "report" if len(args.paths) == 1 else Path("report"))
    try:
        report = write_report(args.paths, out)
    except FileNotFoundError as err:
        print(f"fedexp.report: error: {err}", file=sys.stderr)
        return 2
    print(f"report: {report}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
