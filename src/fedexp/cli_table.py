"""The final table of `python -m fedexp`: its title (`run_title`), the best round of the
objective (`best_round`), the rows on the data (`data_rows`) and the table itself (`print_table`).

The imports inside this module's functions are there for start-up time: the title is made before
torch is imported, and the table is printed only after a run.
"""

from __future__ import annotations

from pathlib import Path

from fedexp.core.summary import RunSummary

TABLE_KEYS = (
    "eval/global/acc",
    "eval/global/client_acc_mean",
    "eval/personal/acc_mean",
    "eval/personal/acc_std",
    "eval/personal/acc_min",
    "eval/personal/acc_max",
    "eval/finetuned/acc_mean",
    "eval/finetuned/acc_std",
    "eval/group/gap",
    "attack/backdoor_asr",
    "attack/backdoor_asr_personal",
    "eval/global/loss",
    "eval/global/client_loss_mean",
    "eval/personal/loss_mean",
    "eval/finetuned/loss_mean",
    "privacy/mia_acc",
    "privacy/mia_auc",
    "privacy/mia_tpr@1%fpr",
    "privacy/mia_tpr@0.1%fpr",
    "train/loss",
    "comm/up_bits_total",
    "comm/down_bits_total",
)

# metrics `metric_title` leaves as their keys, in words
TITLES = {
    "attack/backdoor_asr": "backdoor success, global model, triggered test inputs",
    "attack/backdoor_asr_personal": "backdoor success, personal models, mean over honest clients",
}

# overrides left out of the final table's title: the choices it names, and keys that never
# change a result (any key under them too)
TITLED = ("algorithm", "dataset")
UNTITLED = ("progress", "device", "logger", "paths", "resume", "threads", "checkpoint_every")
UNTITLED += ("client_store", "hydra", "progress_every_s")


def run_title(choices: dict, overrides: list[str] | tuple[str, ...] = ()) -> str:
    """`fedprox on cifar10 (algorithm.mu=0.01 seed=1)`: the algorithm, the dataset and the
    command-line overrides that can change a result."""
    shown = []
    for override in overrides:
        key = override.lstrip("+~").partition("=")[0]
        if key not in TITLED and key.split(".")[0].split("/")[0] not in UNTITLED:
            shown.append(override.lstrip("+~"))
    head = f"{choices.get('algorithm', '?')} on {choices.get('dataset', '?')}"
    return head + (f" ({' '.join(shown)})" if shown else "")


def best_round(run_dir: Path, name: str) -> tuple[int, float] | None:
    """(round, value) of the best logged value of the objective `name` in metrics.jsonl: the
    lowest for a loss, else the highest; the earliest such round on ties. None if never logged."""
    import json

    path = Path(run_dir) / "metrics.jsonl"
    points = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row.get(name), (int, float)) and "round" in row:
            points.append((int(row["round"]), float(row[name])))
    if not points:
        return None
    sign = 1 if "loss" in name else -1
    return min(points, key=lambda p: (sign * p[1], p[0]))


def data_rows(metrics) -> list[tuple[str, str]]:
    """The final table's rows on the data: the share of the training data the clients hold,
    and the server's pool where one was set aside."""
    held, train = metrics.get("data/held_by_clients"), metrics.get("data/train_fraction_used")
    rows = []
    if isinstance(held, float):
        split = f" ({train:.1%} in training splits)" if isinstance(train, float) else ""
        rows.append(("training data the clients hold", f"{held:.1%}{split}"))
    pool = metrics.get("data/server_pool")
    if pool:
        rows.append(("server pool (no client holds it)", f"{pool:,} samples"))
    return rows


def print_table(summary: RunSummary, choices: dict, title: str | None = None, best=None) -> None:
    """The final table: titled with the run (`run_title`), the last evaluation's metrics (each
    named by what it measures: test or validation, global or personal), the data the clients
    held, the objective at the end and at its best round (`best`: (round, value)), and under
    it the run's warnings: what changes what the numbers mean."""
    from rich.console import Console
    from rich.table import Table

    from fedexp.config.validation import NO_OBJECTIVE
    from fedexp.core.summary import metric_title

    metrics = summary.metrics
    caption = [f"warning: {line}" for line in summary.warnings]
    table = Table(
        title=f"{title or run_title(choices)} — {summary.status}",
        caption="\n".join(caption) or None,
        caption_justify="left",
    )
    table.add_column("metric", no_wrap=True)
    table.add_column("value", justify="right", no_wrap=True)
    table.add_column("key", style="dim", overflow="fold")
    evaluated = metrics.get("round")
    if summary.status != "completed":  # the metrics may be older than the last round run
        shown = f"{evaluated} of {summary.rounds_completed} run" if evaluated else "none yet"
        table.add_row("metrics of round", shown, "")
    for key in TABLE_KEYS:
        if key in metrics and metrics[key] is not None:
            v = metrics[key]
            text = f"{v:.4f}" if isinstance(v, float) else f"{v:,}"
            title = TITLES.get(key) or metric_title(key)
            table.add_row(title, text, key if title != key else "")
    objective = summary.objective
    if objective is not None and objective.value is not None:
        name = metric_title(objective.name)
        table.add_row(f"objective: {name}", f"{objective.value:.4f}", objective.name)
    elif objective is not None and objective.name == NO_OBJECTIVE:
        table.add_row("objective: none", "no validation data", "")
    if objective is not None and best is not None:
        table.add_row(f"best objective (round {best[0]})", f"{best[1]:.4f}", objective.name)
    for name, value in data_rows(metrics):
        table.add_row(name, value, "")
    table.add_row("rounds", str(summary.rounds_completed), "")
    table.add_row("wall time (s)", f"{summary.timing.wall_time_s:.1f}", "")
    Console(width=max(130, Console().width)).print(table)
