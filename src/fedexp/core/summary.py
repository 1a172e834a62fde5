"""`RunSummary`: how a run ended, its final metrics and what it ran; `summary.json` is its
`to_dict()`, and every reader of a `summary.json` goes through `RunSummary.from_dict`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# options added to an algorithm after run dirs were saved without them, at the value that gives
# the behaviour those runs had (their YAML default): `fedexp.config.saved.add_new_keys` gives an
# older run's saved config the key, and the config hash leaves a key out while it holds that
# value (`fedexp.runtime.fingerprint.stable_config`), so an older checkpoint still matches
ADDED_KEYS: dict[str, dict[str, object]] = {
    "fedexp.algorithms.fedhenn.fedhenn": {"align_layer": "body"},
    "fedexp.algorithms.frl.FRL": {"round_lr_decay": 1.0, "local_lr_schedule": "constant"},
}


STATUSES = ("completed", "diverged", "interrupted", "pruned", "config_error", "failed")
REFUSED = ("config_error", "failed")  # statuses whose summary holds only the error


@dataclass(frozen=True)
class Objective:
    """The metric returned to a sweeper (`objective`), and its final value (None if absent)."""

    name: str
    value: float | None = None


@dataclass(frozen=True)
class Timing:
    """Wall time of the run (seconds) and the mean time of its rounds."""

    wall_time_s: float
    round_s_mean: float


@dataclass(frozen=True)
class RunSummary:
    """A run's summary.

    Attributes:
        status: completed, diverged, interrupted, pruned (by an Optuna pruner), config_error
            (a sweep job refused before building anything) or failed (a sweep job that raised
            while it ran: a full disk, a bug); for the last two only `error`,
            `rounds_completed`, `metrics`, `choices` and `config` are meaningful, and only
            they are written.
        rounds_completed: rounds run to the end (a diverged round is not).
        metrics: the metrics of the last evaluated round (no time/*), data coverage and
            runtime/threads and runtime/processes (the processes that trained each round).
        config: the resolved config.
        choices: the Hydra group choices (algorithm, dataset, ...).
        diverged_round: the round whose loss or model went non-finite.
        stop_signal: the signal's name (SIGTERM, SIGINT) of an interrupted run.
        checkpoint_round: the round the checkpoint on disk holds.
        resumed_from_round: the checkpoint round a resumed run started from.
        objective: the sweeper's metric and its value.
        client_acc: per-client final accuracies (lists per kind).
        describe: facts the algorithm and attack report about themselves.
        timing: wall time and mean round time.
        error: the refusal of a config_error job, the cause of a failed one (one line).
        warnings: what changes what the numbers mean (a degenerate setting, rounds with a
            malicious majority, training data no client held), one line each; the final
            table, the sweep table and the report show them beside the numbers.
        data_fingerprint: a hash of what the clients held (the dataset and every client's
            train/validation/test indices): runs compared on the same data share it.
    """

    status: str
    rounds_completed: int = 0
    metrics: Mapping[str, Any] = field(default_factory=dict)
    config: Mapping[str, Any] = field(default_factory=dict)
    choices: Mapping[str, Any] = field(default_factory=dict)
    diverged_round: int | None = None
    stop_signal: str | None = None
    checkpoint_round: int | None = None
    resumed_from_round: int | None = None
    objective: Objective | None = None
    client_acc: Mapping[str, Any] = field(default_factory=dict)
    describe: Mapping[str, Any] = field(default_factory=dict)
    timing: Timing | None = None
    error: str | None = None
    warnings: tuple[str, ...] = ()
    data_fingerprint: str | None = None

    @property
    def completed(self) -> bool:
        return self.status == "completed"

    def to_dict(self) -> dict[str, Any]:
        """The `summary.json` form (plain containers)."""
        out: dict[str, Any] = {
            "status": self.status,
            "rounds_completed": self.rounds_completed,
            "metrics": dict(self.metrics),
            "choices": dict(self.choices),
            "config": dict(self.config),
        }
        if self.status in REFUSED:
            return {**out, "error": self.error}
        objective = self.objective or Objective("")
        timing = self.timing or Timing(0.0, 0.0)
        return {
            **out,
            "diverged_round": self.diverged_round,
            "stop_signal": self.stop_signal,
            "checkpoint_round": self.checkpoint_round,
            "resumed_from_round": self.resumed_from_round,
            "objective": {"name": objective.name, "value": objective.value},
            "client_acc": dict(self.client_acc),
            "describe": dict(self.describe),
            "timing": {"wall_time_s": timing.wall_time_s, "round_s_mean": timing.round_s_mean},
            "warnings": list(self.warnings),
            "data_fingerprint": self.data_fingerprint,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RunSummary:
        """Read a `summary.json`; keys it lacks (older or refused runs) take their defaults.

        Raises:
            ValueError: `data` is not a summary (not a mapping).
        """
        if not isinstance(data, Mapping):
            raise ValueError(f"a run summary is a JSON object, not {type(data).__name__}")
        objective = data.get("objective")
        timing = data.get("timing")
        return cls(
            status=str(data.get("status", "?")),
            rounds_completed=data.get("rounds_completed") or 0,
            metrics=dict(data.get("metrics") or {}),
            config=dict(data.get("config") or {}),
            choices=dict(data.get("choices") or {}),
            diverged_round=data.get("diverged_round"),
            stop_signal=data.get("stop_signal"),
            checkpoint_round=data.get("checkpoint_round"),
            resumed_from_round=data.get("resumed_from_round"),
            objective=Objective(objective.get("name"), objective.get("value"))
            if isinstance(objective, Mapping)
            else None,
            client_acc=dict(data.get("client_acc") or {}),
            describe=dict(data.get("describe") or {}),
            timing=Timing(timing.get("wall_time_s"), timing.get("round_s_mean"))
            if isinstance(timing, Mapping)
            else None,
            error=data.get("error"),
            warnings=tuple(str(w) for w in data.get("warnings") or ()),
            data_fingerprint=data.get("data_fingerprint"),
        )


_STATS = {"mean": "mean over clients", "std": "std over clients", "min": "min over clients"}
_STATS["max"] = "max over clients"


def metric_title(key: str) -> str:
    """What an `eval/` metric measures, short: `test acc, global model, pooled`, `validation
    loss, personal models, mean over clients`; other keys as they are."""
    parts = key.split("/")
    if parts[0] != "eval" or len(parts) < 3:
        return key
    split, rest = ("validation", parts[2:]) if parts[1] == "val" else ("test", parts[1:])
    kind, name = rest[0], rest[-1]
    measure = "loss" if "loss" in name else "acc"
    if kind == "group":
        if name == "gap":
            return f"{split} acc gap, best - worst client group"
        return f"{split} {measure}, client group {'/'.join(rest[1:-1])}"
    model = {
        "global": "global model",
        "personal": "personal models",
        "finetuned": "fine-tuned global model",
    }.get(kind, kind)
    stat = name.rsplit("_", 1)[-1] if "_" in name else ""
    where = _STATS.get(stat, "pooled")
    return f"{split} {measure}, {model}, {where}"
