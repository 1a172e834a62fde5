"""From run summaries to a claim's measured values and whether it holds in direction.

Pure functions over plain data: `summaries` maps a setting id to {seed: RunSummary} (the
`summary.json` of each run that wrote one, completed or not; a run that wrote none is absent).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from fedexp.claims.claim import Claim, Term
from fedexp.core.summary import RunSummary


@dataclass
class Measured:
    """A term's values: `values` per seed, their mean and sample std (0 with one seed)."""

    label: str
    key: str | None
    values: dict[int, float] = field(default_factory=dict)
    missing: str | None = None  # why there is no value (a failed run, a metric not reported)
    final: dict[int, float] = field(default_factory=dict)  # a drop at the final round

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


Tails = dict[str, dict[int, dict[str, float]]]  # setting -> seed -> metric -> last-10 mean
TAIL = 10  # evaluated rounds a drop is averaged over


def tail_means(rows: list[dict], keys: tuple[str, ...], n: int = TAIL) -> dict[str, float]:
    """Each of `keys`' mean over the last `n` rows (evaluated rounds) that report it finite."""
    out = {}
    for key in keys:
        values = [
            float(r[key])
            for r in rows
            if isinstance(r.get(key), int | float) and math.isfinite(float(r[key]))
        ]
        if values:
            out[key] = sum(values[-n:]) / len(values[-n:])
    return out


def measure(
    term: Term,
    summaries: dict[str, dict[int, RunSummary]],
    seeds: list[int] | None = None,
    tails: Tails | None = None,
) -> Measured:
    """A term's per-seed values over all of `seeds` (default: every seed any of its settings
    ran); a drop term pairs the clean and attacked runs by seed, over its `window`: the mean
    of the last 10 evaluated rounds (`tails`, from each run's metrics.jsonl; the final round
    where a run has none) or the final round. A drop's final-round values are kept beside.

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
    problems, values, finals = [], {}, {}
    for seed in seeds:
        got, last = {}, {}
        seed_tails = [(tails or {}).get(sid, {}).get(seed, {}).get(key) for sid in settings]
        # both sides over one window: the last 10 evaluations where every run has them, else
        # the final round for all (a diverged attacked run has its last evaluation only)
        use_tail = term.window == "last 10" and None not in seed_tails
        for sid, tail in zip(settings, seed_tails):
            run = summaries.get(sid, {}).get(seed)
            status = "failed" if run is None else run.status
            if status == "completed":
                last[sid] = float(run.metrics[key])
                got[sid] = tail if use_tail else last[sid]
            elif status == "diverged" and term.clean and sid == term.setting:
                got[sid] = last[sid] = collapse_value(run, key)
                if got[sid] is None:
                    problems.append(f"{sid} seed {seed} diverged before any evaluation")
            else:
                problems.append(f"{sid} seed {seed} {status}")
        if len(got) == len(settings) and None not in got.values():
            value = got[term.setting]
            values[seed] = got[term.clean] - value if term.clean else value
            if term.clean:
                finals[seed] = last[term.clean] - last[term.setting]
    if problems:
        return Measured(term.label, None, missing="runs not completed: " + ", ".join(problems))
    return Measured(term.label, key, values, final=finals)


CONFIDENCE = 0.95  # the paired interval's level


@dataclass
class Interval:
    """A relation `a op b` measured as the paired per-seed differences d = a − b (same seed:
    same partition and sampling): their mean, and its two-sided 95 % t interval (n − 1 degrees
    of freedom; infinite with one seed; zero width when every seed gives the same d)."""

    relation: str
    op: str
    n: int
    mean: float
    low: float
    high: float

    @property
    def verdict(self) -> str:
        """yes: the interval excludes 0 in the claimed direction; no: in the other direction;
        inconclusive otherwise."""
        up = self.op in (">", ">=")
        if (self.low > 0) if up else (self.high < 0):
            return "yes"
        if (self.high < 0) if up else (self.low > 0):
            return "no"
        return "inconclusive"

    def text(self, scale: float = 1.0, digits: int = 3) -> str:
        def f(v: float) -> str:
            return f"{v * scale:+.{digits}f}" if math.isfinite(v) else ("+∞" if v > 0 else "−∞")

        return f"{self.relation}: Δ {f(self.mean)} [{f(self.low)}, {f(self.high)}]"


def paired_interval(a: Measured, b: Measured, op: str) -> Interval:
    """`a op b` over the seeds both have, as paired differences (`Interval`)."""
    from scipy.stats import t

    seeds = sorted(set(a.values) & set(b.values))
    diffs = [a.values[s] - b.values[s] for s in seeds]
    relation = f"{a.label} {op} {b.label}"
    n = len(diffs)
    if n == 0:
        return Interval(relation, op, 0, math.nan, -math.inf, math.inf)
    mean = sum(diffs) / n
    if n == 1:
        return Interval(relation, op, 1, mean, -math.inf, math.inf)
    half = float(t.ppf(0.5 + CONFIDENCE / 2, n - 1)) * sample_std(diffs) / math.sqrt(n)
    return Interval(relation, op, n, mean, mean - half, mean + half)


@dataclass
class Verdict:
    """A claim's verdict from its relations' paired intervals: `yes` when every relation's
    interval excludes 0 in the claimed direction, `no` when one excludes it the other way,
    `inconclusive` otherwise, `n/a` when a term has no value (`holds` None).

    `holds`: True for yes, False for no, None for n/a and inconclusive alike (`text` tells
    them apart)."""

    intervals: list[Interval]
    missing: bool = False

    @property
    def verdicts(self) -> list[str]:
        return [i.verdict for i in self.intervals]

    def text(self) -> str:
        if self.missing:
            return "n/a"
        if not self.intervals:
            return "measured (no comparison)"
        if any(v == "no" for v in self.verdicts):
            return "no"
        if self.verdicts and all(v == "yes" for v in self.verdicts):
            return "yes"
        return "inconclusive"

    @property
    def holds(self) -> bool | None:
        return {"yes": True, "no": False}.get(self.text())

    @property
    def failed(self) -> list[str]:
        """The relations whose interval excludes 0 against the claim."""
        return [i.relation for i in self.intervals if i.verdict == "no"]


def judge(measured: list[Measured], relations: tuple[tuple[int, str, int], ...]) -> Verdict:
    """Each (i, op, j) as the paired interval of measured[i] − measured[j]; n/a when a compared
    term has no value (a term shown beside them does not void the verdict)."""
    compared = {k for i, _, j in relations for k in (i, j)}
    if any(measured[k].missing for k in compared):
        return Verdict([], missing=True)
    return Verdict([paired_interval(measured[i], measured[j], op) for i, op, j in relations])


def evaluate(
    claim: Claim,
    summaries: dict[str, dict[int, RunSummary]],
    seeds: list[int] | None = None,
    tails: Tails | None = None,
) -> tuple[list[Measured], Verdict]:
    """Measure every term of a claim over `seeds` and judge its relations."""
    measured = [measure(term, summaries, seeds, tails) for term in claim.terms]
    return measured, judge(measured, claim.relations)
