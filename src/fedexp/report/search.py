"""A hyperparameter search in the report: the objective against each searched parameter, the
best trial marked (an Optuna sweep, `hparams_search=...`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedexp.report import plots


@dataclass
class Search:
    """What the trials of one search share: its parameters, direction and objective metric."""

    params: dict[str, str]  # key -> the sweeper's search space (`tag(log, interval(...))`)
    direction: str  # maximize | minimize
    objective: str


def _hydra(run) -> dict:
    from omegaconf import OmegaConf

    path = Path(run.path) / ".hydra" / "hydra.yaml"
    if not path.exists():
        return {}
    return OmegaConf.to_container(OmegaConf.load(path), resolve=False).get("hydra", {}) or {}


def find_search(runs) -> Search | None:
    """The search the runs are trials of (the sweeper's `params` in a run's `.hydra/hydra.yaml`
    where `hparams_search` is chosen); None when they are not."""
    for run in runs:
        if not run.summary.choices.get("hparams_search"):
            continue
        sweeper = _hydra(run).get("sweeper") or {}
        if sweeper.get("params"):
            objective = run.summary.objective.name if run.summary.objective else ""
            params = {str(k): str(v) for k, v in sweeper["params"].items()}
            return Search(params, str(sweeper.get("direction", "maximize")), objective)
    return None


def trials(runs, search: Search, flatten) -> tuple[list[dict], int | None]:
    """Each completed trial's parameter values and objective, and the index of the best."""
    out = []
    for run in runs:
        value = run.summary.objective.value if run.summary.objective else None
        if not run.completed or value is None or not math.isfinite(value):
            continue
        flat = flatten(dict(run.summary.config))
        out.append({"params": {k: flat.get(k) for k in search.params}, "objective": value})
    if not out:
        return out, None
    values = [t["objective"] for t in out]
    best = int(np.argmax(values) if search.direction == "maximize" else np.argmin(values))
    return out, best


def _short(value) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def plot_search(runs, path: Path, flatten) -> list[str]:
    """Objective vs each parameter, one panel each, the best trial a red star; returns the
    report's lines (the best trial) or [] when the runs are not a search."""
    search = find_search(runs)
    if search is None:
        return []
    found, best = trials(runs, search, flatten)
    if best is None:
        return []
    plt = plots._pyplot()
    keys = list(search.params)
    fig, axes = plt.subplots(
        1, len(keys), figsize=(4.5 * len(keys), 3.8), squeeze=False, layout="constrained"
    )
    ys = np.array([t["objective"] for t in found])
    for ax, key in zip(axes[0], keys):
        raw = [t["params"][key] for t in found]
        try:
            xs = np.array(raw, dtype=float)
        except (TypeError, ValueError):  # a categorical parameter: one position per value
            cats = sorted({str(v) for v in raw})
            xs = np.array([cats.index(str(v)) for v in raw], dtype=float)
            ax.set_xticks(range(len(cats)), cats, fontsize=8)
        ax.scatter(xs, ys, s=22, color="tab:blue", alpha=0.7, label="trial")
        ax.scatter(
            xs[best], ys[best], s=160, marker="*", color="tab:red", zorder=3, label="best trial"
        )
        numeric = all(isinstance(v, int | float) for v in raw) and bool((xs > 0).all())
        if numeric and ("log" in search.params[key] or xs.max() / xs.min() > 20):
            from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

            ax.set_xscale("log")  # ticks at 1, 2, 5 x 10^k, written plainly (0.02, not 2x10^-2)
            ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
            ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
            ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set(xlabel=key, ylabel=search.objective or "objective", title=f"objective vs {key}")
        ax.grid(alpha=0.3)
    axes[0][-1].legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=8, frameon=False)
    plots._save(plt, fig, path, True)
    shown = ", ".join(f"`{k}` = {_short(found[best]['params'][k])}" for k in keys)
    return [
        f"{len(found)} completed trials, {search.direction} `{search.objective}`; best "
        f"{ys[best]:.4f} at {shown} (red star).",
    ]
