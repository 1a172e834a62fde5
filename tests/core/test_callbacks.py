"""The callback protocol: order of events, metrics an evaluation callback adds, read-only
reports, and the summary's JSON form."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from conftest import smoke_experiment
from fedexp.core.callbacks import Callback, RoundReport
from fedexp.core.summary import Objective, RunSummary, Timing
from fedexp.loggers.base import logs_artifacts
from fedexp.loggers.files import CSVLogger, RunRecorder
from fedexp.loggers.wandb_logger import WandbLogger


class Recorder(Callback):
    """Records every hook call; on evaluation rounds adds `extra` (a function of the round)."""

    def __init__(self, name: str, events: list, extra=None):
        self.name, self.events, self.extra = name, events, extra
        self.reports: list[RoundReport] = []

    def on_run_start(self, info):
        self.events.append((self.name, "start", info.rounds, info.resumed_from_round))

    def on_evaluate(self, report):
        self.events.append((self.name, "evaluate", report.round, sorted(report.metrics)))
        return self.extra(report.round) if self.extra else None

    def on_round_end(self, report):
        self.reports.append(report)
        self.events.append((self.name, "round_end", report.round, report.evaluated))

    def on_run_end(self, summary):
        self.events.append((self.name, "end", summary.status, summary.rounds_completed))


@pytest.mark.experiment
def test_hooks_run_in_order_and_added_metrics_reach_every_logger(tmp_path):
    torch.set_num_threads(1)
    exp = smoke_experiment(tmp_path, "rounds=3", "eval_every=2", "checkpoint_every=0")
    events: list = []
    first = Recorder("a", events, extra=lambda t: {"audit/value": t / 4})
    second = Recorder("b", events)
    exp.callbacks.extend([first, second])
    summary = exp.run()

    steps = [e[:3] for e in events]
    assert steps == [
        ("a", "start", 3), ("b", "start", 3),
        ("a", "round_end", 1), ("b", "round_end", 1),
        ("a", "evaluate", 2), ("b", "evaluate", 2), ("a", "round_end", 2), ("b", "round_end", 2),
        ("a", "evaluate", 3), ("b", "evaluate", 3), ("a", "round_end", 3), ("b", "round_end", 3),
        ("a", "end", "completed"), ("b", "end", "completed"),
    ]  # fmt: skip
    assert events[0][3] is None  # a fresh run: nothing resumed
    assert [e[3] for e in events if e[1] == "round_end"][::2] == [False, True, True]
    # the later callback's on_evaluate sees what the earlier one added; the earlier does not
    seen = {(e[0], e[2]): e[3] for e in events if e[1] == "evaluate"}
    assert "audit/value" not in seen[("a", 2)] and "audit/value" in seen[("b", 2)]
    # merged before on_round_end: every callback, metrics.jsonl and the summary have it
    assert [r.metrics.get("audit/value") for r in second.reports] == [None, 0.5, 0.75]
    rows = [json.loads(x) for x in (exp.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [(r["round"], r.get("audit/value")) for r in rows] == [(1, None), (2, 0.5), (3, 0.75)]
    assert summary.metrics["audit/value"] == 0.75
    assert summary.rounds_completed == 3


@pytest.mark.experiment
def test_a_report_is_read_only_and_a_later_report_does_not_change_an_earlier_one(tmp_path):
    torch.set_num_threads(1)
    exp = smoke_experiment(tmp_path, "rounds=2", "eval_every=1", "checkpoint_every=0")
    recorder = Recorder("r", [])
    exp.callbacks.append(recorder)
    exp.run()
    first, last = recorder.reports
    with pytest.raises(TypeError):
        first.metrics["train/loss"] = 0.0  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        first.round = 5  # type: ignore[misc]
    assert (first.round, last.round, last.last_round) == (1, 2, 2)
    assert first.metrics["round"] == 1 and first.loop_state["round"] == 1
    # comm totals are cumulative: round 2's report holds both rounds, round 1's only its own
    assert first.metrics["comm/up_bits_total"] == first.metrics["comm/up_bits"]
    total = first.metrics["comm/up_bits"] + last.metrics["comm/up_bits"]
    assert last.loop_state["totals"]["comm/up_bits_total"] == total


def completed_summary() -> RunSummary:
    return RunSummary(
        status="completed",
        rounds_completed=4,
        metrics={"eval/global/acc": 0.75, "comm/up_bits_total": 64},
        config={"seed": 0, "client": {"lr": 0.1}},
        choices={"algorithm": "fedavg"},
        checkpoint_round=4,
        objective=Objective("eval/global/acc", 0.75),
        client_acc={"global": [0.5, 1.0]},
        describe={"params": 10},
        timing=Timing(2.5, 0.5),
    )


def test_the_summary_round_trips_through_its_json_form():
    summary = completed_summary()
    data = json.loads(json.dumps(summary.to_dict()))
    assert data["objective"] == {"name": "eval/global/acc", "value": 0.75}
    assert data["timing"] == {"wall_time_s": 2.5, "round_s_mean": 0.5}
    assert data["diverged_round"] is None and data["resumed_from_round"] is None
    assert RunSummary.from_dict(data) == summary


def test_a_refused_job_writes_only_what_it_knows():
    refused = RunSummary("config_error", error="seed: must be >= 0", config={"seed": -1})
    data = refused.to_dict()
    assert set(data) == {"status", "error", "rounds_completed", "metrics", "choices", "config"}
    assert data["rounds_completed"] == 0 and data["metrics"] == {}
    back = RunSummary.from_dict(data)
    assert back.error == "seed: must be >= 0" and back.objective is None and not back.completed


def test_a_summary_file_that_is_not_an_object_is_refused():
    with pytest.raises(ValueError, match="JSON object, not list"):
        RunSummary.from_dict([1, 2])
    assert RunSummary.from_dict({}).status == "?"  # older files lack keys: defaults


def test_only_loggers_that_record_files_make_the_run_wait_for_the_partition_plot(tmp_path):
    # the plot is drawn in a background thread; a logger overriding `log_artifact` gets it
    # complete at `on_run_start`, the others do not wait for it
    assert not logs_artifacts([RunRecorder(tmp_path), CSVLogger(tmp_path), Recorder("a", [])])
    assert logs_artifacts([CSVLogger(tmp_path), WandbLogger.__new__(WandbLogger)])
