"""From run summaries to a claim's measured values and whether it holds in direction.

Pure functions over plain data: `summaries` maps a setting id to {seed: RunSummary} (the
`summary.json` of each run that wrote one, completed or not; a run that wrote none is absent).
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


def collapse_value(run: RunSummary, key: str) -> float | None:
    """What a diverged attacked run counts as: the accuracy of its last evaluation, or chance
    (1 / the classes its data used) where it diverged before any; None where neither is known."""
    value = run.metrics.get(key)
    if value is not None and math.isfinite(float(value)):
        return float(value)
    classes = run.metrics.get("data/classes_used")
    return 1.0 / float(classes) if classes else None


def measure(
    term: Term, summaries: dict[str, dict[int, RunSummary]], seeds: list[int] | None = None
) -> Measured:
    """A term's per-seed values over all of `seeds` (default: every seed any of its settings
    ran); a drop term pairs the clean and attacked runs by seed.

    Never a subset: a seed whose run of any of the term's settings failed, diverged or did not
    finish makes the term n/a, naming the runs, because the runs that fail are the ones an
    attack may have broken. The one exception is a diverged *attacked* run of a drop term: the
    attack succeeded, so it counts as a collapse (`collapse_value`).
    """
    settings = [term.setting, *([term.clean] if term.clean else [])]
    if seeds is None:
        seeds = sorted({seed for sid in settings for seed in summaries.get(sid, {})})
    if not seeds:
        return Measured(term.label, None, missing=f"no completed run of {term.setting}")
    completed = [
        run
        for sid in settings
        for run in summaries.get(sid, {}).values()
        if run is not None and run.completed
    ]
    key = pick_key(term.keys, completed) if completed else term.keys[0]
    if key is None:
        return Measured(term.label, None, missing=f"{' / '.join(term.keys)} not reported")
    problems, values = [], {}
    for seed in seeds:
        got = {}
        for sid in settings:
            run = summaries.get(sid, {}).get(seed)
            status = "failed" if run is None else run.status
            if status == "completed":
                got[sid] = float(run.metrics[key])
            elif status == "diverged" and term.clean and sid == term.setting:
                got[sid] = collapse_value(run, key)
                if got[sid] is None:
                    problems.append(f"{sid} seed {seed} diverged before any evaluation")
            else:
                problems.append(f"{sid} seed {seed} {status}")
        if len(got) == len(settings) and None not in got.values():
            value = got[term.setting]
            values[seed] = got[term.clean] - value if term.clean else value
    if problems:
        return Measured(term.label, None, missing="runs not completed: " + ", ".join(problems))
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
    claim: Claim, summaries: dict[str, dict[int, RunSummary]], seeds: list[int] | None = None
) -> tuple[list[Measured], Verdict]:
    """Measure every term of a claim over `seeds` and judge its relations."""
    measured = [measure(term, summaries, seeds) for term in claim.terms]
    return measured, judge(measured, claim.relations)
