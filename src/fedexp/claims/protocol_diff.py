"""What the protocol tier changes from the papers' protocols, read from composed configs.

Each of the tier's settings is a paper preset (`experiment=...`, with the method's own options)
plus the tier's departures (`DEPARTURES`: the data, the model, the rounds, the samples a client,
...). Both are composed (`settings_text.composed`); every key whose value differs is a row. What
the presets do not set is listed by hand in `UNCONFIGURED`: the metric a paper reports, and the
reference code's lr rules, which fedexp has as options but the paper presets leave off.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fedexp.claims.claim import Setting
from fedexp.claims.settings_text import _fmt, composed

# the overrides by which the tier departs from a preset (a prefix matches `key=...`)
DEPARTURES = (
    "dataset=",
    "model=",
    "~model.bias",
    "rounds=",
    "eval_every=",
    "dataset.num_samples=",
    "partition.server_pool=",
    "algorithm.rad_size=",
    "privacy.num_targets=",
    "algorithm.eta0=",  # FedHeNN's η0 sweep: each value against the paper's
    "algorithm.align_layer=",
)
# keys that change no number of a run, or that one data set's loader has and the other not
QUIET = ("eval_every", "eval.", "objective")
# differences no config key holds: (the settings they concern, what the paper does, here)
UNCONFIGURED = {
    "frl": [
        ("the lr over rounds", "the reference code: lr·0.999 each round",
         "constant (the preset's; `algorithm.round_lr_decay=0.999` gives the reference's)"),
        ("the lr within a round", "the reference code: cosine over the local epochs",
         "constant (the preset's; `algorithm.local_lr_schedule=cosine` gives the reference's)"),
    ],
    "fedhenn": [
        ("the accuracy reported", "local test accuracy averaged over clients, every method",
         "the same (`eval/global/client_acc_mean` for FedAvg/FedProx)"),
    ],
    "waffle": [
        ("the accuracy reported", "local test accuracy (WAFFLe personal, FedAvg global)",
         "the same (`eval/global/client_acc_mean` for FedAvg)"),
    ],
}  # fmt: skip


def is_departure(override: str) -> bool:
    return any(override.startswith(p) for p in DEPARTURES)


def paper_overrides(setting: Setting) -> tuple[str, ...]:
    """The setting's overrides less the tier's departures: the paper's protocol."""
    return tuple(o for o in setting.overrides if not is_departure(o))


def _shown(key: str, ours: Mapping[str, Any], theirs: Mapping[str, Any]) -> bool:
    if key.startswith(QUIET) or key.endswith("data_dir"):  # where files lie: no setting
        return False
    # an option of one loader or model only (the data set or model differs: it says so),
    # but the size of a generated data set, which sets the samples a client holds
    one_sided = (key in ours) != (key in theirs)
    kept = key == "dataset.num_samples"
    return kept or not (one_sided and key.split(".")[0] in ("dataset", "model"))


def differences(setting: Setting) -> list[tuple[str, str, str]]:
    """(key, the paper's value, the tier's value) for every key the departures change."""
    paper = composed(Setting(setting.id, paper_overrides(setting), setting.cost))
    here = composed(setting)
    missing = object()
    rows = []
    for key in sorted(set(paper) | set(here)):
        a, b = paper.get(key, missing), here.get(key, missing)
        if a != b and _shown(key, here, paper):
            rows.append((key, "—" if a is missing else _fmt(a), "—" if b is missing else _fmt(b)))
    return rows


def family(setting_id: str) -> str:
    if setting_id.startswith(("frl", "fedavg-trmean", "signsgd", "smavg")):
        return "frl"
    if "fedhenn" in setting_id or setting_id.endswith("-fhc"):
        return "fedhenn"
    return "waffle"


def differences_markdown(settings: Sequence[Setting], claims_of: Mapping[str, str]) -> str:
    """One table of every difference from the papers' protocols: a row per (key, paper value,
    value here), naming the settings it concerns; the unconfigured differences after them."""
    rows: dict[tuple[str, str, str], list[str]] = {}
    for setting in settings:
        for row in differences(setting):
            rows.setdefault(row, []).append(setting.id)
    lines = [
        "| settings (claims) | key | the paper's protocol (its preset) | here |",
        "| --- | --- | --- | --- |",
    ]
    for (key, paper, here), ids in sorted(rows.items(), key=lambda kv: (kv[1][0], kv[0])):
        named = ", ".join(f"{sid} ({claims_of.get(sid, '?')})" for sid in ids)
        lines.append(f"| {named} | `{key}` | {paper} | {here} |")
    families = sorted({family(s.id) for s in settings})
    for name in families:
        for what, paper, here in UNCONFIGURED.get(name, []):
            ids = [s.id for s in settings if family(s.id) == name]
            named = ", ".join(f"{sid} ({claims_of.get(sid, '?')})" for sid in ids)
            lines.append(f"| {named} | {what} (not set by the preset) | {paper} | {here} |")
    return "\n".join(line.replace("\n", " ") for line in lines) + "\n"
