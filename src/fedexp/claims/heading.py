"""The lines around a claims table: the command as a reader can retype it, the commit, the runs'
time (made and reused), the seconds per run; and vary.md's table."""

from __future__ import annotations

import argparse
import subprocess
from datetime import datetime
from pathlib import Path

from fedexp.claims.runner import SettingResult, attack_option


def commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=Path(__file__).resolve().parent,  # the checkout this code runs from
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip() or "unknown"


def own_seconds(records) -> list[float]:
    """The run time each reused record's summary gives (runs whose summary has none left out)."""
    times = [getattr(r.summary.timing, "wall_time_s", None) for r in records if r.reused]
    return [t for t in times if isinstance(t, (int, float))]


def timing_line(results: dict[str, SettingResult]) -> str:
    """Mean seconds per run of each setting: of the runs this check made (CLI start-up
    included), else of the reused runs (their summaries' own time, `reused` beside it)."""
    parts = []
    for sid, result in results.items():
        done = [r for r in result.runs.values() if r.status == "completed"]
        fresh = [r.run_s for r in done if not r.reused]
        own = own_seconds(done)
        if fresh:
            parts.append(f"{sid} {sum(fresh) / len(fresh):.0f} s")
        elif own:
            parts.append(f"{sid} {sum(own) / len(own):.0f} s reused")
    return (
        "Seconds per run (mean over seeds; CLI start-up included, except for `reused` runs, "
        "timed by their own summaries): " + (", ".join(parts) or "none completed")
    )


def shown_argv(argv: list[str], args: argparse.Namespace) -> list[str]:
    """The command as a reader can retype it: `--update-doc` and `--out` (a directory of the
    machine that made the table) left out."""
    shown, skip = [], False
    for arg in argv:
        if skip:
            skip = False
            continue
        name = arg.partition("=")[0]
        if name in ("--update-doc", "--out"):
            skip = "=" not in arg
            continue
        shown.append(arg)
    return shown


def duration(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes} min {secs} s"


def header(argv, args, seeds, results: dict[str, SettingResult], wall: float) -> str:
    """The line above the table: the command, date, commit, seeds, and the runs' time: the
    runs this check made (their own seconds summed, and the wall time of the check), the
    runs reused from an earlier check counted apart."""
    extra = f"; every run with `{' '.join(args.override)}`" if args.override else ""
    if any(attack_option(o) for o in args.override):
        extra += " (an `attack.*` option: the attacked settings alone)"
    records = [r for res in results.values() for r in res.runs.values()]
    fresh = [r for r in records if not r.reused]
    reused = len(records) - len(fresh)
    ran = (
        f"{len(fresh)} runs made, {duration(sum(r.run_s for r in fresh))} of run time, "
        f"{duration(wall)} of wall time with {args.jobs} job(s)"
        if fresh
        else "no runs made"
    )
    if reused:
        own = own_seconds(records)
        ran += f"; {reused} runs reused from an earlier check"
        ran += (
            f" (their own time, from their summaries: {duration(sum(own))} of run time,"
            " CLI start-up not included)"
            if len(own) == reused
            else " (their time not counted)"
        )
    return (
        f"`{' '.join(['python -m fedexp.claims', *shown_argv(argv, args)])}` — "
        f"{datetime.now():%Y-%m-%d}, commit {commit()}: seeds {', '.join(map(str, seeds))}; "
        f"{ran}{extra}."
    )


def vary_markdown(argv, args, tables: list[tuple[str, dict]], wall: float) -> str:
    """vary.md: each claim's measures and verdict for each value of the varied override."""
    key = args.vary.partition("=")[0]
    minutes, seconds = divmod(int(wall), 60)
    lines = [
        f"`{' '.join(['python -m fedexp.claims', *shown_argv(argv, args)])}` — "
        f"{datetime.now():%Y-%m-%d}, commit "
        f"{commit()}: {args.tier} tier, seeds 0..{args.seeds - 1}, {len(tables)} values of "
        f"`{key}` in {minutes} min {seconds} s.",
        "",
        f"| claim | `{key}` | measured (mean ± std over seeds) | verdict: paired Δ [95 % CI] |",
        "| --- | --- | --- | --- |",
    ]
    for extra, record in tables:
        value = extra.partition("=")[2]
        for entry in record["claims"]:
            cells = [f"{entry['id']}. {entry['slug']}", value, entry["measured_text"]]
            cells.append(entry["holds_text"])
            lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines) + "\n"
