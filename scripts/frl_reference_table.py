"""docs/frl_reference.md from the results file of `scripts/frl_reference.py` (nothing is run).

The results file (JSON): `setting` (what both sides ran), `splits` (per seed: the data's
fingerprint, fedexp's attackers, the order the reference got the clients in) and `sides`: per
side (`reference`, then each fedexp variant), per seed, `clean` and `attacked` records with
`final` (accuracy at the last round), `last10` (mean over the last 10 evaluated rounds), `acc`
and `malicious_in_round` (per round). Drops are computed here: clean − attacked, per seed.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

METRICS = (("final", "final round"), ("last10", "mean of the last 10 rounds"))


def drops(side: dict[str, Any], metric: str) -> dict[str, float]:
    """Seed -> clean − attacked accuracy of one side."""
    return {s: r["clean"][metric] - r["attacked"][metric] for s, r in sorted(side.items())}


def values(side: dict[str, Any], run: str, metric: str) -> list[float]:
    return [r[run][metric] for _, r in sorted(side.items())]


def mean_std(xs) -> str:
    """'mean ± std' (sample std, ddof = 1; '—' with one value)."""
    arr = np.asarray(list(xs), dtype=float)
    if arr.size == 0:
        return "—"
    std = f"{arr.std(ddof=1):.3f}" if arr.size > 1 else "—"
    return f"{arr.mean():.3f} ± {std}"


def paired(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    """The paired comparison of two sides' per-seed values over their common seeds: the mean and
    sample std of a − b, the paired t statistic and its two-sided p (Student's t, n − 1 df), and
    on how many seeds a > b."""
    seeds = sorted(set(a) & set(b))
    d = np.asarray([a[s] - b[s] for s in seeds], dtype=float)
    n = d.size
    out = {"n": n, "mean": float(d.mean()) if n else math.nan, "std": math.nan}
    out.update(t=math.nan, p=math.nan, larger=int((d > 0).sum()))
    if n > 1:
        out["std"] = float(d.std(ddof=1))
        if out["std"] > 0:
            from scipy import stats

            out["t"] = out["mean"] / (out["std"] / math.sqrt(n))
            out["p"] = float(2 * stats.t.sf(abs(out["t"]), n - 1))
    return out


def fmt(x: float, digits: int = 3) -> str:
    return "—" if x is None or not math.isfinite(x) else f"{x:.{digits}f}"


def side_rows(sides: dict[str, Any], labels: dict[str, str]) -> list[str]:
    rows = [
        "| side | clean, final | attacked, final | drop, final | clean, last 10 | "
        "attacked, last 10 | drop, last 10 |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, side in sides.items():
        cells = []
        for metric, _ in METRICS:
            cells += [
                mean_std(values(side, "clean", metric)),
                mean_std(values(side, "attacked", metric)),
                f"**{mean_std(drops(side, metric).values())}**",
            ]
        rows.append(f"| {labels.get(name, name)} | " + " | ".join(cells) + " |")
    return rows


def seed_rows(sides: dict[str, Any], labels: dict[str, str], metric: str) -> list[str]:
    names = list(sides)
    seeds = sorted({s for side in sides.values() for s in side}, key=int)
    head = "| seed | " + " | ".join(labels.get(n, n) for n in names) + " |"
    rows = [head, "| --- |" + " --- |" * len(names)]
    for seed in seeds:
        cells = []
        for name in names:
            r = sides[name].get(seed)
            if r is None:
                cells.append("—")
                continue
            clean, attacked = r["clean"][metric], r["attacked"][metric]
            cells.append(f"{clean:.3f} → {attacked:.3f} ({clean - attacked:+.3f})")
        rows.append(f"| {seed} | " + " | ".join(cells) + " |")
    return rows


def paired_rows(sides: dict[str, Any], labels: dict[str, str], base: str) -> list[str]:
    rows = [
        f"| {labels.get(base, base)} − … | metric | mean difference ± std | paired t | p "
        f"(two-sided) | seeds where {labels.get(base, base)} is larger |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for name in sides:
        if name == base:
            continue
        for metric, what in METRICS:
            for quantity, pick in (
                ("drop", lambda side, m=metric: drops(side, m)),
                ("clean accuracy", lambda side, m=metric: _by_seed(side, "clean", m)),
            ):
                p = paired(pick(sides[base]), pick(sides[name]))
                rows.append(
                    f"| {labels.get(name, name)} | {quantity}, {what} | "
                    f"{fmt(p['mean'])} ± {fmt(p['std'])} | {fmt(p['t'], 2)} | {fmt(p['p'])} | "
                    f"{p['larger']} of {p['n']} |"
                )
    return rows


def _by_seed(side: dict[str, Any], run: str, metric: str) -> dict[str, float]:
    return {s: r[run][metric] for s, r in side.items()}


def majority_rounds(side: dict[str, Any], per_round: int) -> int:
    """Attacked rounds with half or more of the cohort malicious, over all seeds."""
    return sum(
        sum(2 * m >= per_round for m in r["attacked"].get("malicious_in_round", []))
        for r in side.values()
    )


def render(results: dict[str, Any], text: str) -> str:
    """The doc: `text` (the rules, formatted with the setting) and the tables."""
    setting, sides = results["setting"], results["sides"]
    labels = setting.get("labels", {})
    lines = [text.format(**setting).rstrip(), ""]
    lines += ["## Drops, mean ± std over the seeds", ""]
    lines += side_rows(sides, labels)
    for metric, what in METRICS:
        lines += ["", f"## Per seed, {what}: clean → attacked (drop)", ""]
        lines += seed_rows(sides, labels, metric)
    lines += ["", "## Paired comparison (per seed, the same split on both sides)", ""]
    lines += paired_rows(sides, labels, "reference")
    per_round = setting["clients_per_round"]
    counts = ", ".join(
        f"{labels.get(n, n)} {majority_rounds(side, per_round)}" for n, side in sides.items()
    )
    rounds = setting["rounds"] * len(next(iter(sides.values()), {}))
    lines += [
        "",
        f"Attacked rounds with half or more of the cohort malicious (of {rounds} per side, "
        f"both re-drawing such cohorts): {counts}.",
        "",
    ]
    return "\n".join(lines)


def write_doc(results_path: Path, doc_path: Path, text: str) -> str:
    doc = render(json.loads(Path(results_path).read_text()), text)
    Path(doc_path).write_text(doc)
    return doc
