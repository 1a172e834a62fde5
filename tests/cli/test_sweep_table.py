"""The table a sweep prints at its end: one run a group, mixed objectives, the data each column
measures (numbers by hand: 0.5/0.7 give mean 0.6, sample std 0.1414)."""

from __future__ import annotations

from pathlib import Path

from fedexp.core.summary import Objective, RunSummary, Timing
from fedexp.report import Run
from fedexp.sweep import print_sweep_table, sweep_notes, sweep_rows

VAL_GLOBAL = "eval/val/global/acc"
VAL_PERSONAL = "eval/val/personal/acc_mean"


def fake_run(
    algorithm: str,
    seed: int,
    value: float,
    objective: str = VAL_GLOBAL,
    partition: dict | None = None,
) -> Run:
    summary = RunSummary(
        "completed",
        rounds_completed=10,
        metrics={"eval/global/acc": value},
        config={"seed": seed, "partition": partition or {"_target_": "fedexp.data.schemes.Shards"}},
        choices={"algorithm": algorithm, "partition": "multimodal" if partition else "shards"},
        objective=Objective(objective, value),
        timing=Timing(1.0, 0.1),
    )
    return Run(Path(f"/s/{algorithm}-{seed}"), summary)


def test_a_group_of_one_run_shows_its_value_without_a_spread():
    runs = [fake_run("fedavg", 0, 0.5), fake_run("fedprox", 0, 0.25)]
    _, heads, rows = sweep_rows(runs)
    assert heads == ["group", "runs", f"objective: {VAL_GLOBAL}", "eval/global/acc"]
    assert rows == [
        ["algorithm=fedavg", "1", "0.5000", "0.5000"],
        ["algorithm=fedprox", "1", "0.2500", "0.2500"],
    ]


def test_mixed_objectives_are_named_on_each_row():
    runs = [
        fake_run("fedavg", 0, 0.5),
        fake_run("fedavg", 1, 0.7),
        fake_run("waffle", 0, 0.4, objective=VAL_PERSONAL),
    ]
    _, heads, rows = sweep_rows(runs)
    assert heads == ["group", "runs", "objective metric", "objective", "eval/global/acc"]
    assert rows == [
        ["algorithm=fedavg", "2", VAL_GLOBAL, "0.6000 ± 0.1414", "0.6000 ± 0.1414"],
        ["algorithm=waffle", "1", VAL_PERSONAL, "0.4000", "0.4000"],
    ]
    notes = sweep_notes(heads, runs)
    assert notes == [
        f"{VAL_GLOBAL}: the global model on the union of the clients' validation splits",
        f"{VAL_PERSONAL}: each client's own model on its validation split, over clients",
        "eval/global/acc: the global model on the pooled test set (the dataset's own test "
        "split; the union of the clients' test splits where it has none)",
    ]


def test_on_the_multimodal_split_the_table_says_validation_and_test_weigh_groups_differently(
    capsys,
):
    part = {"_target_": "fedexp.data.schemes.Multimodal", "group_ratio": 5}
    runs = [
        fake_run("fedavg", 0, 0.5, partition=part),
        fake_run("fedprox", 0, 0.25, partition=part),
    ]
    print_sweep_table(runs, Path("/s"))
    out = capsys.readouterr().out
    assert "± nan" not in out and "0.2500" in out
    lines = out.splitlines()
    assert lines[-3].startswith(f"{VAL_GLOBAL}: the global model on the union")
    assert lines[-2].startswith("eval/global/acc: the global model on the pooled test set")
    assert lines[-1].startswith(
        "partition=multimodal: the validation splits weigh the majority and minority clients' "
        "classes 5 : 1"
    )
    assert "shards" not in " ".join(sweep_notes(["group", "runs", "x"], [fake_run("a", 0, 0.1)]))
