"""`python -m fedexp.report <run or multirun dirs...> [--out DIR] [--sharey]`: compare runs.

Reads `summary.json` and `metrics.jsonl` of every run found under the given directories, groups
the runs by the config values that differ between them (found automatically; the seed is left
out, so a group's runs are its seeds) and writes `report.md` with PNG plots, one colour per group
and one marker and line style in all of them: accuracy vs round (mean ± std band over seeds), the
final table, the final accuracies and MIA metrics as points with error bars, client-accuracy box
plots, accuracy vs cumulative communication, the majority/minority gap vs round, DP-FedAvg's
privacy budget (final ε table, ε vs round, accuracy vs ε) and, for an Optuna search, the
objective against each searched parameter with the best trial marked. `--grid
aggregator,attack [--baseline attack=none]` also prints a sweep over two keys as one table
(`fedexp.report.grid`: a row per aggregator, a column per attack, each cell's Δ to the baseline
column) and puts it in report.md.
A quantity a run does not record (None, NaN, absent, a run that stopped early) is left out of
that figure or table, and report.md says so under "Left out".
Spread is the sample standard deviation over a group's seeds (ddof = 1); a group of one run has
none. Group labels are short (`mu=0.0187`: 3 significant digits, more where two would clash).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from fedexp.report.grid import Grid, grid_lines, grid_table
from fedexp.report.missing import left_out
from fedexp.report.plots import (
    ACCURACY,
    LOSS,
    _save,
    curve,
    fmt,
    mean_std,
    plot_acc_vs_comm,
    plot_client_boxes,
    plot_final_accuracy,
    plot_mia,
    plot_vs_round,
)
from fedexp.report.privacy import plot_privacy, privacy_notes, privacy_table
from fedexp.report.runs import (
    GLOBAL_GROUPS,
    IGNORED,
    Run,
    find_runs,
    flatten,
    group_runs,
    grouping_keys,
    label,
    read_overrides,
)
from fedexp.report.search import plot_search
from fedexp.report.tables import (
    FINAL,
    data_differences,
    final_metrics,
    final_table,
    group_warnings,
    seed_of,
)

__all__ = ["Run", "curve", "find_runs", "group_runs", "main", "mean_std", "write_report"]
__all__ += ["_save", "fmt", "plot_mia"]
# the pieces `runs` and `tables` hold, importable from here as before they moved there
__all__ += ["FINAL", "GLOBAL_GROUPS", "IGNORED", "data_differences", "final_metrics"]
__all__ += ["final_table", "flatten", "group_warnings", "grouping_keys", "label"]
__all__ += ["read_overrides"]

BACKDOOR = {
    "attack/backdoor_asr": "global model, pooled test set",
    "attack/backdoor_asr_personal": "personal models, mean over honest clients",
}
BACKDOOR_NOTE = (
    "The attack success rate: the share of test inputs outside the backdoor's target class "
    "classified as the target once the trigger is on (`attack=backdoor`)."
)
SPREAD = (
    "Values are the mean over the completed seeds of each group ± the sample standard "
    "deviation (ddof = 1); a value without ± has no spread (one seed, or equal values)."
)


def write_report(
    paths: Sequence[str | Path], out: str | Path, sharey: bool = False, grid: Grid | None = None
) -> Path:
    """Write report.md and its PNGs into `out`; returns the path of report.md. `sharey`: the
    panels of one accuracy figure (global vs personal model) share their y-axis; `grid`: a
    section with the runs as a grid of two keys (ValueError where they do not form one)."""
    runs = find_runs(paths)
    if not runs:
        raise FileNotFoundError(f"no summary.json under {', '.join(map(str, paths))}")
    groups, keys = group_runs(runs)
    md = _head(paths, runs, groups, keys) + (grid_lines(runs, grid) if grid else [])
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    md += _notes(groups) + _figures(groups, out, sharey)
    best = plot_search(runs, out / "search.png", flatten)
    if best:
        md += ["## Hyperparameter search", "", "![search](search.png)", "", *best, ""]
    md += ["## Runs", "", "| group | status | run dir |", "|---|---|---|"]
    for name, group in groups.items():
        md += [f"| {name} | {r.summary.status} | `{r.path}` |" for r in group]
    report = out / "report.md"
    report.write_text("\n".join(md) + "\n")
    return report


def _head(paths, runs: list[Run], groups: dict[str, list[Run]], keys: list[str]) -> list[str]:
    """report.md's title, what the groups differ in, and the final metrics' table."""
    shown = [k.removeprefix("choice:") for k in keys]
    plural = "group" if len(groups) == 1 else "groups"
    if shown:
        differ = ", ".join(f"`{k}`" for k in shown)
    elif len({seed_of(r) for r in runs}) > 1:
        differ = "only the seed (one group)"
    else:
        differ = "nothing (one group)"
    return [
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


def _notes(groups: dict[str, list[Run]]) -> list[str]:
    """The sections under the final table, where they have lines: the warnings, DP's privacy
    budget, and what the report left out."""
    md = []
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
    return md


def _figures(groups: dict[str, list[Run]], out: Path, sharey: bool) -> list[str]:
    """Each figure drawn into `out` (those with something to show), a section each."""
    md = []
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
        (
            "Backdoor attack success rate vs round",
            "backdoor_asr.png",
            plot_vs_round,
            (BACKDOOR, "attack success rate"),
            band + " " + BACKDOOR_NOTE,
        ),
        ("Membership inference", "mia_acc.png", plot_mia, (), bars + " Dashed: chance."),
        ("Privacy budget: ε vs round, accuracy vs ε", "privacy.png", plot_privacy, (), eps_caption),
    ]
    for title, filename, draw, extra, caption in sections:
        if draw(groups, out / filename, *extra):
            md += [f"## {title}", "", f"![{title}]({filename})", "", caption, ""]
    return md


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
    parser.add_argument(
        "--grid",
        metavar="ROW,COL",
        help="also print the runs as one table, a row per value of ROW and a column per value "
        "of COL (e.g. aggregator,attack), and put it in report.md",
    )
    parser.add_argument(
        "--baseline",
        metavar="COL=VALUE",
        help="with --grid: the column the others are compared with (attack=none): each cell "
        "adds its mean minus that column's mean in its row",
    )
    parser.add_argument(
        "--grid-metric", metavar="METRIC", help="with --grid: the metric (eval/global/acc)"
    )
    args = parser.parse_args(argv)
    out = args.out or (Path(args.paths[0]) / "report" if len(args.paths) == 1 else Path("report"))
    try:
        grid = _grid(args)
        report = write_report(args.paths, out, sharey=args.sharey, grid=grid)
        if grid:  # the runs formed a grid: write_report checked it
            print(grid_table(find_runs(args.paths), grid))
    except (FileNotFoundError, ValueError) as err:
        print(f"fedexp.report: error: {err}", file=sys.stderr)
        return 2
    print(f"report: {report}")
    return 0


def _grid(args: argparse.Namespace) -> Grid | None:
    """The grid `--grid`, `--baseline`, `--grid-metric` ask for (ValueError: a bad one)."""
    if args.grid is None:
        if args.baseline is not None or args.grid_metric is not None:
            raise ValueError("--baseline and --grid-metric go with --grid ROW,COL")
        return None
    return Grid.parse(args.grid, args.baseline, args.grid_metric)


if __name__ == "__main__":
    sys.exit(main())
