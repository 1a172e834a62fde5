"""`python -m fedexp.report <run or multirun dirs...> [--out DIR] [--sharey]`: compare runs.

Reads `summary.json` and `metrics.jsonl` of every run found under the given directories, groups
the runs by the config values that differ between them (found automatically; the seed is left
out, so a group's runs are its seeds) and writes `report.md` with PNG plots, one colour per group
and one marker and line style in all of them: accuracy vs round (mean ± std band over seeds), the
final table, the final accuracies and MIA metrics as points with error bars, client-accuracy box
plots, accuracy vs cumulative communication, the majority/minority gap vs round, DP-FedAvg's
privacy budget (final ε table, ε vs round, accuracy vs ε) and, for an Optuna search, the
objective against each searched parameter with the best trial marked.
A quantity a run does not record (None, NaN, absent, a run that stopped early) is left out of
that figure or table, and report.md says so under "Left out".
Spread is the sample standard deviation over a group's seeds (ddof = 1); a group of one run has
none. Group labels are short (`mu=0.0187`: 3 significant digits, more where two would clash).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedexp.core.summary import RunSummary, metric_title
from fedexp.report.missing import comm_total, left_out
from fedexp.report.plots import (
    ACCURACY,
    LOSS,
    _column,
    _save,
    curve,
    finite,
    fmt,
    mean_std,
    plot_acc_vs_comm,
    plot_client_boxes,
    plot_final_accuracy,
    plot_mia,
    plot_vs_round,
)
from fedexp.report.privacy import plot_privacy, privacy_notes, privacy_table
from fedexp.report.search import plot_search

__all__ = ["Run", "curve", "find_runs", "group_runs", "main", "mean_std", "write_report"]
__all__ += ["_save", "fmt", "plot_mia"]

SPREAD = (
    "Values are the mean over the completed seeds of each group ± the sample standard "
    "deviation (ddof = 1); a value without ± has no spread (one seed, or equal values)."
)
# config keys that never explain a difference in results (or are the seeds being averaged)
IGNORED = ("seed", "paths", "progress", "progress_every_s", "device", "resume", "checkpoint_every")
IGNORED += ("logger",)
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
FINAL = (
    "eval/global/acc",
    "eval/global/client_acc_mean",
    "eval/personal/acc_mean",
    "eval/personal/acc_min",
    "eval/group/gap",
    "eval/global/loss",
    "eval/global/client_loss_mean",
    "eval/personal/loss_mean",
    "privacy/mia_acc",
    "privacy/mia_auc",
    "privacy/mia_tpr@1%fpr",
    "privacy/mia_tpr@0.1%fpr",
)


@dataclass
class Run:
    path: Path
    summary: RunSummary
    rows: list[dict] = field(default_factory=list)
    overrides: dict[str, str] | None = None  # the command line's `key=value`s (None: unknown)

    @property
    def completed(self) -> bool:
        return self.summary.completed

    def series(self, metric: str) -> dict[int, float]:
        """round -> value of `metric` in metrics.jsonl (rounds where it was logged finite)."""
        return {
            int(r["round"]): float(r[metric])
            for r in self.rows
            if finite(r.get(metric)) and finite(r.get("round"))
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
            runs.append(
                Run(summary_path.parent, summary, rows, read_overrides(summary_path.parent))
            )
    return runs


def read_overrides(run_dir: Path) -> dict[str, str] | None:
    """The run's command-line overrides (`.hydra/overrides.yaml`, as Hydra saved them) as
    key -> value text (`+`/`++`/`~` dropped); None where the file is absent or unreadable."""
    path = Path(run_dir) / ".hydra" / "overrides.yaml"
    try:
        import yaml

        items = yaml.safe_load(path.read_text())
    except (OSError, ValueError, ImportError):  # yaml's errors are ValueErrors
        return None
    if not isinstance(items, list):
        return None
    out = {}
    for item in items:
        key, _, value = str(item).lstrip("+~").partition("=")
        out[key] = value
    return out


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


def _ignored(key: str) -> bool:
    return key.split(".")[0].split("/")[0] in IGNORED or key.startswith("hydra")


def grouping_keys(runs: list[Run]) -> list[str]:
    """What the sweep varied: Hydra group choices ('choice:algorithm') and config keys
    ('client.lr').

    Where every run has its command line (`.hydra/overrides.yaml`), these are the keys typed
    there whose values differ between the runs (the seed aside): a preset's or an algorithm's
    own defaults never make a label. Otherwise, the choices and config keys that differ, a
    key under a varying choice (algorithm.mu when algorithm varies) being explained by the
    choice; every key when a _global_ preset (experiment) varies.
    """
    if runs and all(r.overrides is not None for r in runs):
        typed = sorted({k for r in runs for k in r.overrides if not _ignored(k)})
        varying = [k for k in typed if _varies([_typed_value(r, k) for r in runs])]
        return [f"choice:{k}" if _is_choice(runs, k) else k for k in varying]
    choices = [r.summary.choices for r in runs]
    # a nested derived group ('paper_algorithm/frl_dense@frl_dense') is ignored with its parent
    names = sorted({k for c in choices for k in c if k.split("/")[0] not in IGNORED})
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


def _is_choice(runs: list[Run], key: str) -> bool:
    return any(key in r.summary.choices for r in runs)


def _typed_value(run: Run, key: str) -> Any:
    """The value the run had for a typed key: its choice, its config value, or the text."""
    if key in run.summary.choices:
        return run.summary.choices.get(key)
    flat = flatten(dict(run.summary.config))
    if key in flat:
        return flat[key]
    return (run.overrides or {}).get(key)


def _value(value: Any, digits: int | None) -> str:
    if isinstance(value, float) and digits is not None:
        return f"{value:.{digits}g}"
    return str(value)


def label(run: Run, keys: list[str], digits: int | None = None) -> str:
    """The run's group label: `key=value` of each grouping key, with its group prefix
    (`algorithm=fedprox, algorithm.mu=0.01`; floats to `digits` significant digits; None: as
    they are); a key the run does not have is left out. Without keys: the algorithm."""
    if not keys:
        return str(run.summary.choices.get("algorithm") or "runs")
    flat = flatten(dict(run.summary.config))
    parts = []
    for key in keys:
        if key.startswith("choice:"):
            name = key.removeprefix("choice:")
            parts.append(f"{name}={run.summary.choices.get(name)}")
        else:
            value = flat.get(key, (run.overrides or {}).get(key))
            if value is not None:
                parts.append(f"{key}={_value(value, digits)}")
    return ", ".join(parts) or str(run.summary.choices.get("algorithm") or "runs")


def _order(run: Run, keys: list[str]) -> tuple:
    """Sort key of a group: its values, numbers by size (mu=0.01 before mu=0.1 before mu=1)."""
    flat = flatten(dict(run.summary.config))
    out = []
    for key in keys:
        name = key.removeprefix("choice:")
        value = run.summary.choices.get(name) if key.startswith("choice:") else flat.get(key)
        number = isinstance(value, int | float) and not isinstance(value, bool)
        out.append((0, float(value), "") if number else (1, 0.0, str(value)))
    return tuple(out)


def group_runs(runs: list[Run]) -> tuple[dict[str, list[Run]], list[str]]:
    """Runs grouped by what differs, under short labels (3 significant digits, more where
    two groups would get the same label), groups in the order of their values."""
    keys = grouping_keys(runs)
    exact: dict[str, list[Run]] = {}
    for run in runs:
        exact.setdefault(label(run, keys), []).append(run)
    ordered = sorted(exact.values(), key=lambda g: _order(g[0], keys))
    for digits in (3, 4, 5, 6, 8, 10, 12, 17, None):
        names = [label(g[0], keys, digits) for g in ordered]
        if len(set(names)) == len(names):
            break
    return dict(zip(names, ordered)), keys


# ---- the final table ----------------------------------------------------------------------------
def final_metrics(groups: dict[str, list[Run]]) -> list[str]:
    """The final-table columns: FINAL metrics and per-group accuracies any run reports."""
    present = {k for runs in groups.values() for r in runs for k in r.summary.metrics}
    per_group = sorted(
        k for k in present if k.startswith("eval/group/") and k.endswith("/acc_mean")
    )
    return [k for k in FINAL if k in present] + per_group


def final_table(groups: dict[str, list[Run]]) -> str:
    """Final metrics per group: completed runs' mean ± sample std (ddof = 1)."""
    metrics = final_metrics(groups)
    named = [f"{metric_title(m)} (`{m}`)" if metric_title(m) != m else m for m in metrics]
    head = ["group", "runs", "rounds", *named, "comm total (MB)"]
    done = {name: [r for r in runs if r.completed] for name, runs in groups.items()}
    columns = [
        _column(
            [mean_std([r.summary.rounds_completed for r in d]) for d in done.values()], digits=0
        )
    ]
    for metric in metrics:
        columns.append(
            _column([mean_std([r.summary.metrics.get(metric) for r in d]) for d in done.values()])
        )
    comm = [mean_std([comm_total(r) for r in d]) for d in done.values()]
    columns.append(_column(comm, scale=1 / 8e6, digits=2))
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for i, (name, runs) in enumerate(groups.items()):
        # diverged/interrupted runs are counted only
        other = [r.summary.status for r in runs if not r.completed]
        count = f"{len(done[name])}" + (
            f" (+{len(other)} {', '.join(sorted(set(other)))})" if other else ""
        )
        lines.append("| " + " | ".join([name, count, *(c[i] for c in columns)]) + " |")
    return "\n".join(lines)


# ---- what changes what the numbers mean ----------------------------------------------------------
def _seed(run: Run) -> Any:
    return (run.summary.config or {}).get("seed")


def group_warnings(groups: dict[str, list[Run]]) -> list[str]:
    """The runs' warnings (`summary.json`), a line each per group: `warning, <group>: ...` when
    every run of the group has it, `warning, <group>, seed <s>: ...` for one run's."""
    lines = []
    for name, runs in groups.items():
        texts = [tuple(r.summary.warnings) for r in runs]
        for text in dict.fromkeys(t for ws in texts for t in ws):
            if all(text in ws for ws in texts):
                lines.append(f"warning, {name}: {text}")
                continue
            for run, ws in zip(runs, texts):
                if text in ws:
                    lines.append(f"warning, {name}, seed {_seed(run)}: {text}")
    return lines


def data_differences(groups: dict[str, list[Run]]) -> list[str]:
    """One line per seed at which runs of different groups trained on different client data
    (their `data_fingerprint`s differ): their numbers compare methods and data at once."""
    by_seed: dict[Any, dict[str, list[str]]] = {}
    for name, runs in groups.items():
        for run in runs:
            if run.summary.data_fingerprint:
                held = by_seed.setdefault(_seed(run), {})
                held.setdefault(run.summary.data_fingerprint, [])
                if name not in held[run.summary.data_fingerprint]:
                    held[run.summary.data_fingerprint].append(name)
    lines = []
    for seed, held in by_seed.items():
        if len(held) > 1:
            sets = " | ".join(", ".join(names) for names in held.values())
            lines.append(
                f"data differs, seed {seed}: the clients held different data in these groups "
                f"({sets}; summary.json data_fingerprint): e.g. partition.server_pool, the "
                "partition or the dataset differ"
            )
    return lines


# ---- the report ----------------------------------------------------------------------------------
def write_report(paths: Sequence[str | Path], out: str | Path, sharey: bool = False) -> Path:
    """Write report.md and its PNGs into `out`; returns the path of report.md. `sharey`: the
    panels of one accuracy figure (global vs personal model) share their y-axis."""
    runs = find_runs(paths)
    if not runs:
        raise FileNotFoundError(f"no summary.json under {', '.join(map(str, paths))}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    groups, keys = group_runs(runs)
    shown = [k.removeprefix("choice:") for k in keys]
    plural = "group" if len(groups) == 1 else "groups"
    if shown:
        differ = ", ".join(f"`{k}`" for k in shown)
    elif len({_seed(r) for r in runs}) > 1:
        differ = "only the seed (one group)"
    else:
        differ = "nothing (one group)"
    md = [
        "# fedexp report",
        "",
        f"{len(runs)} runs in {len(groups)} {plural} from {', '.join(f'`{p}`' for p in paths)}.",
        f"Groups differ in: {differ}. {SPREAD}",
        "",
        "## Final metrics",
        "",
        final_table(groups),
        "",
    ]
    warned = group_warnings(groups) + data_differences(groups)
    if warned:
        md += [
            "## Warnings",
            "",
            "What changes what the numbers above mean (each run's `summary.json` `warnings`, "
            "and the clients' data compared by `data_fingerprint`):",
            "",
            *(f"- {line}" for line in warned),
            "",
        ]
    eps = privacy_table(groups, flatten)
    if eps:
        md += ["## Privacy budget (DP)", "", *eps, "", f"ε at δ after the last round. {SPREAD}", ""]
    notes = left_out(groups, final_metrics(groups)) + privacy_notes(groups)
    if notes:
        md += ["## Left out", "", *(f"- {line}" for line in notes), ""]
    gap = {"eval/group/gap": "best - worst client group, test accuracy"}
    band = "Lines: the mean over a group's seeds; band: ± 1 sample std (ddof = 1)."
    eps_caption = (
        "Left: ε at δ after each round; right: each evaluated round's accuracy against its ε. "
        "Lines: the mean over a group's seeds; band: ± 1 sample std (ddof = 1)."
    )
    bars = "Points: the mean of a group's completed seeds; bars: ± 1 sample std (ddof = 1)."
    sections = [
        (
            "Accuracy vs round",
            "acc_vs_round.png",
            plot_vs_round,
            (ACCURACY, "test accuracy", None, sharey),
            band,
        ),
        (
            "Loss vs round",
            "loss_vs_round.png",
            plot_vs_round,
            (LOSS, "test loss (cross-entropy)", None, sharey),
            band,
        ),
        ("Final accuracy", "final_acc.png", plot_final_accuracy, (sharey,), bars),
        (
            "Client accuracy distribution",
            "client_acc_box.png",
            plot_client_boxes,
            (sharey,),
            "Each client's final test accuracy, pooled over a group's completed seeds.",
        ),
        (
            "Accuracy vs cumulative communication",
            "acc_vs_comm.png",
            plot_acc_vs_comm,
            (),
            band,
        ),
        ("Majority/minority gap", "group_gap.png", plot_vs_round, (gap, "test accuracy gap"), band),
        ("Membership inference", "mia_acc.png", plot_mia, (), bars + " Dashed: chance."),
        ("Privacy budget: ε vs round, accuracy vs ε", "privacy.png", plot_privacy, (), eps_caption),
    ]
    for title, filename, draw, extra, caption in sections:
        if draw(groups, out / filename, *extra):
            md += [f"## {title}", "", f"![{title}]({filename})", "", caption, ""]
    best = plot_search(runs, out / "search.png", flatten)
    if best:
        md += ["## Hyperparameter search", "", "![search](search.png)", "", *best, ""]
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
    parser.add_argument(
        "--sharey",
        action="store_true",
        help="one y-axis for the panels of an accuracy figure (global vs personal model), so "
        "their values compare by eye (default: each panel its own range)",
    )
    args = parser.parse_args(argv)
    out = args.out or (Path(args.paths[0]) / "report" if len(args.paths) == 1 else Path("report"))
    try:
        report = write_report(args.paths, out, sharey=args.sharey)
    except FileNotFoundError as err:
        print(f"fedexp.report: error: {err}", file=sys.stderr)
        return 2
    print(f"report: {report}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
