"""The runs a report compares: found under the given directories (`find_runs`) and grouped by
the config values that differ between them (`group_runs`; the seed is left out, so a group's runs
are its seeds), each group under a short label (`mu=0.0187`: 3 significant digits, more where two
would clash).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedexp.core.summary import RunSummary
from fedexp.report.plots import finite

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
