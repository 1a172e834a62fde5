"""claims.md and claims.json: the table of claims, and the doc section it is embedded in."""

from __future__ import annotations

import re
from pathlib import Path

from fedexp.claims.catalogue import Claim
from fedexp.claims.verdict import Measured, Verdict

BEGIN, END = "<!-- claims:begin -->", "<!-- claims:end -->"


def fmt_value(value: float, unit: str) -> str:
    if unit == "bits":
        return f"{value / 1e6:.2f} Mbit"
    return f"{value:.3f}"


def fmt_measured(m: Measured, unit: str) -> str:
    """`label mean ± std`, or `label n/a (why)`."""
    if m.missing:
        return f"{m.label} n/a ({m.missing})"
    return f"{m.label} {fmt_value(m.mean, unit)} ± {fmt_value(m.std, unit)}"


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


def holds_text(verdict: Verdict) -> str:
    """`yes`, `yes (within seed spread)`, `no: not A > B`, or `n/a (...)`."""
    holds = verdict.text()
    if verdict.failed:
        holds += ": not " + ", not ".join(verdict.failed)
    return holds.replace("<=", "≤").replace(">=", "≥")


def row(claim: Claim, measured: list[Measured], verdict: Verdict, setting: str = "") -> str:
    """One markdown table row: claim | paper's figure | setting here | measured | holds?

    `setting`: the generated settings text (`settings_text.claim_setting_text`); the claim's
    note alone when empty."""
    values, holds = measured_text(claim, measured), holds_text(verdict)
    cells = [f"{claim.id}. {claim.text}", claim.paper, setting or claim.note, values, holds]
    return "| " + " | ".join(_cell(c) for c in cells) + " |"


def markdown(rows: list[str], header: str, footer: str) -> str:
    """claims.md: a header line, the table, a footer line (the doc embeds this text)."""
    lines = [
        header,
        "",
        "| claim | paper's figure | setting here | measured (mean ± std over seeds) | holds in "
        "direction? |",
        "| --- | --- | --- | --- | --- |",
        *rows,
        "",
        footer,
    ]
    return "\n".join(lines) + "\n"


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
        "clear": verdict.clear,
        "measured_text": measured_text(claim, measured),
        "holds_text": holds_text(verdict),
        "verdict": verdict.text(),
        "failed_relations": verdict.failed,
    }
