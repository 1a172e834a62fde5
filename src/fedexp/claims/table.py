"""claims.md and claims.json: the table of claims, and the doc section it is embedded in."""

from __future__ import annotations

import re
from pathlib import Path

from fedexp.claims.claim import Claim
from fedexp.claims.verdict import Measured, Verdict, sample_std

BEGIN, END = "<!-- claims:begin -->", "<!-- claims:end -->"


def fmt_value(value: float, unit: str) -> str:
    if unit == "bits":
        return f"{value / 1e6:.2f} Mbit"
    if unit == "fine":  # distances and ratios far below 1
        return f"{value:.4g}"
    return f"{value:.3f}"


def fmt_measured(m: Measured, unit: str) -> str:
    """`label mean ± std` (a drop: with its final round's `(final round mean ± std)`), or
    `label n/a (why)`."""
    if m.missing:
        return f"{m.label} n/a ({m.missing})"
    text = f"{m.label} {fmt_value(m.mean, unit)} ± {fmt_value(m.std, unit)}"
    if m.final:
        finals = list(m.final.values())
        mean = sum(finals) / len(finals)
        text += f" (final round {fmt_value(mean, unit)} ± {fmt_value(sample_std(finals), unit)})"
    return text


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def measured_text(claim: Claim, measured: list[Measured]) -> str:
    """`label mean ± std; ...` of the claim's terms (with the metric used where a fallback)."""
    values = "; ".join(fmt_measured(m, t.unit) for m, t in zip(measured, claim.terms))
    fallbacks = {
        (m.key, t.keys[0])
        for m, t in zip(measured, claim.terms)
        if m.key is not None and m.key != t.keys[0]
    }
    for used, wanted in sorted(fallbacks):
        values += f" (`{used}`: {wanted} is not reported by this version)"
    return values


def holds_text(verdict: Verdict, unit: str = "acc") -> str:
    """`yes`, `no` or `inconclusive`, with each relation's paired difference and its 95 %
    interval (`yes: A > B: Δ +0.052 [+0.031, +0.073]`); `n/a` when a term has no value."""
    text = verdict.text()
    if verdict.intervals:
        scale, digits = (1e-6, 2) if unit == "bits" else (1.0, 3)
        text += ": " + "; ".join(i.text(scale, digits) for i in verdict.intervals)
    return text.replace("<=", "≤").replace(">=", "≥")


def row(claim: Claim, measured: list[Measured], verdict: Verdict, setting: str = "") -> str:
    """One markdown table row: claim | paper's figure | setting here | metric of each side |
    measured | verdict with the paired intervals.

    `setting`: the generated settings text (`settings_text.claim_setting_text`); the claim's
    note alone when empty."""
    values = measured_text(claim, measured)
    holds = holds_text(verdict, claim.terms[0].unit)
    cells = [claim_cell(claim), claim.paper, setting or claim.note, metrics_text(claim, measured)]
    cells += [values, holds]
    return "| " + " | ".join(_cell(c) for c in cells) + " |"


def claim_cell(claim: Claim) -> str:
    """The claim as checked, with the paper's sentence and its section (or `the project's`)."""
    text = f"{claim.id}. {claim.text}"
    if claim.quote:
        return f"{text} — “{claim.quote}” ({claim.section})"
    return f"{text} — the project's claim, no sentence of the paper ({claim.section})"


def metrics_text(claim: Claim, measured: list[Measured]) -> str:
    """Each compared side's metric: `FedHeNN: eval/personal/acc_mean; FedAvg: ...`."""
    compared = sorted({k for i, _, j in claim.relations for k in (i, j)})
    parts = []
    for k in compared:
        term, m = claim.terms[k], measured[k]
        key = m.key or term.keys[0]
        what = f"{term.label}: `{key}`"
        if term.clean:
            what += f" drop ({term.window})"
        parts.append(what)
    return "; ".join(parts)


def markdown(rows: list[str], header: str, footer: str) -> str:
    """claims.md: a header line, the table, a footer line (the doc embeds this text)."""
    lines = [
        header,
        "",
        "| claim (the paper's sentence) | paper's figure | setting here | metric of each side | "
        "measured (mean ± std over seeds) | verdict: paired Δ over seeds [95 % t interval] |",
        "| --- | --- | --- | --- | --- | --- |",
        *rows,
        "",
        footer,
    ]
    return "\n".join(lines) + "\n"


def grid_tables(claims: list[Claim], measured: dict[str, list[Measured]]) -> str:
    """For each measurement row (a claim that compares nothing, whose terms are labelled
    `quantity (tag)`): a table of its terms, one line a tag, one column a quantity, each cell
    mean ± std over seeds ("" when the tier has no measurement row)."""
    parts = []
    for claim in claims:
        if claim.relations or claim.id not in measured:
            continue
        grid: dict[str, dict[str, str]] = {}
        columns: list[str] = []
        for term, m in zip(claim.terms, measured[claim.id]):
            found = re.fullmatch(r"(.+) \((.+)\)", term.label)
            if found is None:
                break
            quantity, tag = found.groups()
            if quantity not in columns:
                columns.append(quantity)
            cell = (
                "n/a"
                if m.missing
                else f"{fmt_value(m.mean, term.unit)} ± " + fmt_value(m.std, term.unit)
            )
            grid.setdefault(tag, {})[quantity] = cell
        else:
            lines = [
                f"{claim.id}. {claim.text} (mean ± std over seeds; {claim.note}):",
                "",
                "| | " + " | ".join(_cell(c) for c in columns) + " |",
                "| --- |" + " --- |" * len(columns),
            ]
            for tag, cells in grid.items():
                row_cells = [tag, *(cells.get(c, "") for c in columns)]
                lines.append("| " + " | ".join(_cell(c) for c in row_cells) + " |")
            parts.append("\n".join(lines) + "\n")
    return "\n".join(parts)


def markers(tier: str = "small") -> tuple[str, str]:
    """The begin and end markers of a tier's table in a doc (`claims:` for the small tier,
    `claims-<tier>:` for another)."""
    if tier == "small":
        return BEGIN, END
    return f"<!-- claims-{tier}:begin -->", f"<!-- claims-{tier}:end -->"


def update_doc(doc: Path, text: str, tier: str = "small") -> None:
    """Replace what lies between the doc's markers of `tier` with `text`."""
    begin, end = markers(tier)
    content = doc.read_text()
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.DOTALL)
    if not pattern.search(content):
        raise ValueError(f"{doc}: no {begin} ... {end} section to replace")
    doc.write_text(pattern.sub(lambda _: f"{begin}\n{text}{end}", content, count=1))


def claim_json(claim: Claim, measured: list[Measured], verdict: Verdict, setting: str = "") -> dict:
    return {
        "id": claim.id,
        "slug": claim.slug,
        "claim": claim.text,
        "paper": claim.paper,
        "setting": setting or claim.note,
        "terms": [
            {
                "label": m.label,
                "setting": t.setting,
                "clean": t.clean,
                "metric": m.key,
                "unit": t.unit,
                "values": {str(s): v for s, v in m.values.items()},
                "mean": None if m.missing else m.mean,
                "std": None if m.missing else m.std,
                "missing": m.missing,
            }
            for m, t in zip(measured, claim.terms)
        ],
        "relations": [
            f"{claim.terms[i].label} {op} {claim.terms[j].label}" for i, op, j in claim.relations
        ],
        "holds": verdict.holds,
        "intervals": [
            {
                "relation": i.relation,
                "n": i.n,
                "mean": i.mean,
                "low": i.low,
                "high": i.high,
                "verdict": i.verdict,
            }
            for i in verdict.intervals
        ],  # fmt: skip
        "quote": claim.quote,
        "section": claim.section,
        "measured_text": measured_text(claim, measured),
        "holds_text": holds_text(verdict, claim.terms[0].unit),
        "verdict": verdict.text(),
        "failed_relations": verdict.failed,
    }
