"""From run summaries to a claim's measured values and whether it holds in direction.

Pure functions over plain data: `summaries` maps a setting id to {seed: RunSummary} (the
`summary.json` of each completed run).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from fedexp.claims.catalogue import Claim, Term
from fedexp.core.summary import RunSummary

OPS = {
    ">": lambda a, b: a > b,
    "<": lambda a, b: a < b,
    ">=": lambda a, b: a >= b,
    "<=": lambda a, b: a <= b,
}


@dataclass
class Measured:
    """A term's values: `values` per seed, their mean and sample std (0 with one seed)."""

    label: str
    key: str | None
    values: dict[int, float] = field(default_factory=dict)
    missing: str | None = None  # why there is no value (a failed run, a metric not reported)

    @property
    def mean(self) -> float:
        return sum(self.values.values()) / len(self.values)

    @property
    def std(self) -> float:
        return sample_std(list(self.values.values()))


def sample_std(xs: list[float]) -> float:
    """Standard deviation with Bessel's correction (n − 1); 0.0 for fewer than two values."""
    if len(xs) < 2:
        return 0.0
    mean = sum(xs) / len(xs)
    return math.sqrt(sum((x - mean) ** 2 for x in xs) / (len(xs) - 1))


def pick_key(keys: tuple[str, ...], runs: list[RunSummary]) -> str | None:
    """The first of `keys` that every run's final metrics report (None if none does)."""
    for key in keys:
        if runs and all(run.metrics.get(key) is not None for run in runs):
            return key
    return None


def measure(term: Term, summaries: dict[str, dict[int, RunSummary]]) -> Measured:
    """A term's per-seed values; a drop term pairs the clean and attacked runs by seed."""
    runs = summaries.get(term.setting, {})
    clean = summaries.get(term.clean, {}) if term.clean else {}
    seeds = sorted(set(runs) & set(clean)) if term.clean else sorted(runs)
    if not seeds:
        failed = term.setting if not runs else term.clean
        return Measured(term.label, None, missing=f"no completed run of {failed}")
    pool = [runs[s] for s in seeds] + [clean[s] for s in seeds if term.clean]
    key = pick_key(term.keys, pool)
    if key is None:
        return Measured(term.label, None, missing=f"{' / '.join(term.keys)} not reported")
    values = {}
    for seed in seeds:
        value = float(runs[seed].metrics[key])
        values[seed] = float(clean[seed].metrics[key]) - value if term.clean else value
    return Measured(term.label, key, values)


@dataclass
class Verdict:
    """`holds`: every relation holds on the means (None: something is missing).

    `clear`: every relation's difference of means exceeds the larger of the two stds (a
    difference smaller than the seed-to-seed spread is a direction, not a finding).
    """

    holds: bool | None
    clear: bool
    failed: list[str]

    def text(self) -> str:
        if self.holds is None:
            return "n/a"
        if not self.holds:
            return "no"
        return "yes" if self.clear else "yes (within seed spread)"


def judge(measured: list[Measured], relations: tuple[tuple[int, str, int], ...]) -> Verdict:
    """Check each (i, op, j): measured[i].mean op measured[j].mean."""
    if any(m.missing for m in measured):
        return Verdict(None, False, [])
    holds, clear, failed = True, True, []
    for i, op, j in relations:
        a, b = measured[i], measured[j]
        if not OPS[op](a.mean, b.mean):
            holds = False
            failed.append(f"{a.label} {op} {b.label}")
        if abs(a.mean - b.mean) <= max(a.std, b.std):
            clear = False
    return Verdict(holds, clear, failed)


def evaluate(
    claim: Claim, summaries: dict[str, dict[int, RunSummary]]
) -> tuple[list[Measured], Verdict]:
    """Measure every term of a claim and judge its relations."""
    measured = [measure(term, summaries) for term in claim.terms]
    return measured, judge(measured, claim.relations)
