"""The report's tables and lines of text: the final metrics per group (mean ± sample std over
the completed seeds), the runs' warnings per group, and the seeds at which groups trained on
different client data.
"""

from __future__ import annotations

from typing import Any

from fedexp.core.summary import metric_title
from fedexp.report.missing import comm_total
from fedexp.report.plots import _column, mean_std
from fedexp.report.runs import Run

FINAL = (
    "eval/global/acc",
    "eval/global/client_acc_mean",
    "eval/personal/acc_mean",
    "eval/personal/acc_min",
    "eval/finetuned/acc_mean",
    "eval/group/gap",
    "attack/backdoor_asr",
    "attack/backdoor_asr_personal",
    "eval/global/loss",
    "eval/global/client_loss_mean",
    "eval/personal/loss_mean",
    "privacy/mia_acc",
    "privacy/mia_auc",
    "privacy/mia_tpr@1%fpr",
    "privacy/mia_tpr@0.1%fpr",
)


# ---- the final table ----------------------------------------------------------------------------
def final_metrics(groups: dict[str, list[Run]]) -> list[str]:
    """The final-table columns: FINAL metrics and per-group accuracies any run reports."""
    present = {k for runs in groups.values() for r in runs for k in r.summary.metrics}
    per_group = sorted(
        k for k in present if k.startswith("eval/group/") and k.endswith("/acc_mean")
    )
    return [k for k in FINAL if k in present] + per_group


def final_table(groups: dict[str, list[Run]]) -> str:
    """Final metrics per group: completed runs' mean ± sample std (ddof = 1)."""
    metrics = final_metrics(groups)
    named = [f"{metric_title(m)} (`{m}`)" if metric_title(m) != m else m for m in metrics]
    head = ["group", "runs", "rounds", *named, "comm total (MB)"]
    done = {name: [r for r in runs if r.completed] for name, runs in groups.items()}
    columns = [
        _column(
            [mean_std([r.summary.rounds_completed for r in d]) for d in done.values()], digits=0
        )
    ]
    for metric in metrics:
        columns.append(
            _column([mean_std([r.summary.metrics.get(metric) for r in d]) for d in done.values()])
        )
    comm = [mean_std([comm_total(r) for r in d]) for d in done.values()]
    columns.append(_column(comm, scale=1 / 8e6, digits=2))
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for i, (name, runs) in enumerate(groups.items()):
        # diverged/interrupted runs are counted only
        other = [r.summary.status for r in runs if not r.completed]
        count = f"{len(done[name])}" + (
            f" (+{len(other)} {', '.join(sorted(set(other)))})" if other else ""
        )
        lines.append("| " + " | ".join([name, count, *(c[i] for c in columns)]) + " |")
    return "\n".join(lines)


# ---- what changes what the numbers mean ----------------------------------------------------------
def seed_of(run: Run) -> Any:
    return (run.summary.config or {}).get("seed")


def group_warnings(groups: dict[str, list[Run]]) -> list[str]:
    """The runs' warnings (`summary.json`), a line each per group: `warning, <group>: ...` when
    every run of the group has it, `warning, <group>, seed <s>: ...` for one run's."""
    lines = []
    for name, runs in groups.items():
        texts = [tuple(r.summary.warnings) for r in runs]
        for text in dict.fromkeys(t for ws in texts for t in ws):
            if all(text in ws for ws in texts):
                lines.append(f"warning, {name}: {text}")
                continue
            for run, ws in zip(runs, texts):
                if text in ws:
                    lines.append(f"warning, {name}, seed {seed_of(run)}: {text}")
    return lines


def data_differences(groups: dict[str, list[Run]]) -> list[str]:
    """One line per seed at which runs of different groups trained on different client data
    (their `data_fingerprint`s differ): their numbers compare methods and data at once."""
    by_seed: dict[Any, dict[str, list[str]]] = {}
    for name, runs in groups.items():
        for run in runs:
            if run.summary.data_fingerprint:
                held = by_seed.setdefault(seed_of(run), {})
                held.setdefault(run.summary.data_fingerprint, [])
                if name not in held[run.summary.data_fingerprint]:
                    held[run.summary.data_fingerprint].append(name)
    lines = []
    for seed, held in by_seed.items():
        if len(held) > 1:
            sets = " | ".join(", ".join(names) for names in held.values())
            lines.append(
                f"data differs, seed {seed}: the clients held different data in these groups "
                f"({sets}; summary.json data_fingerprint): e.g. partition.server_pool, the "
                "partition or the dataset differ"
            )
    return lines
