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


def test_each_objective_metric_has_its_own_column():
    runs = [
        fake_run("fedavg", 0, 0.5),
        fake_run("fedavg", 1, 0.7),
        fake_run("waffle", 0, 0.4, objective=VAL_PERSONAL),
    ]
    _, heads, rows = sweep_rows(runs)
    assert heads == [
        "group",
        "runs",
        f"objective: {VAL_GLOBAL}",
        f"objective: {VAL_PERSONAL}",
        "eval/global/acc",
    ]
    # no column holds two metrics: each group's value sits under its own objective
    assert rows == [
        ["algorithm=fedavg", "2", "0.6000 ± 0.1414", "", "0.6000 ± 0.1414"],
        ["algorithm=waffle", "1", "", "0.4000", "0.4000"],
    ]
    notes = sweep_notes(heads, runs)
    assert notes == [
        f"{VAL_GLOBAL}: the global model on the union of the clients' validation splits",
        f"{VAL_PERSONAL}: each client's own model on its validation split, over clients",
        "eval/global/acc: the global model on the pooled test set (the dataset's own test "
        "split; the union of the clients' test splits where it has none)",
    ]


def test_heads_say_test_or_validation_and_global_or_personal():
    from fedexp.sweep import head_text

    assert head_text(f"objective: {VAL_GLOBAL}") == (
        f"objective: validation acc, global model, pooled\n({VAL_GLOBAL})"
    )
    assert head_text(f"objective: {VAL_PERSONAL}").startswith(
        "objective: validation acc, personal models, mean over clients"
    )
    assert head_text("eval/global/acc").startswith("test acc, global model, pooled")
    assert head_text("runs") == "runs"


def test_one_group_and_a_sweep_of_seeds_alone_say_so(capsys):
    print_sweep_table([fake_run("fedavg", 0, 0.5), fake_run("fedavg", 1, 0.7)], Path("/s"))
    out = " ".join(capsys.readouterr().out.split())
    assert "2 runs in 1 group, differing only in the seed" in out
    assert "1 groups" not in out


def with_summary(run: Run, **changes) -> Run:
    import dataclasses

    return Run(run.path, dataclasses.replace(run.summary, **changes), run.rows, run.overrides)


def test_warnings_and_different_client_data_are_printed_under_the_table(capsys):
    degenerate = "FedRep: algorithm.head_epochs=0: the heads never train"
    runs = [
        with_summary(fake_run("fedavg", 0, 0.5), data_fingerprint="aaa"),
        with_summary(fake_run("fedavg", 1, 0.7), data_fingerprint="bbb"),
        with_summary(
            fake_run("fedrep", 0, 0.4), warnings=(degenerate,), data_fingerprint="ccc"
        ),  # seed 0: other data than fedavg's seed 0
        with_summary(
            fake_run("fedrep", 1, 0.6),
            warnings=(degenerate, "3 of 10 rounds had a malicious majority"),
            data_fingerprint="bbb",
        ),
    ]
    print_sweep_table(runs, Path("/s"))
    lines = capsys.readouterr().out.splitlines()
    assert f"warning, algorithm=fedrep: {degenerate}" in lines  # both seeds: once
    assert "warning, algorithm=fedrep, seed 1: 3 of 10 rounds had a malicious majority" in lines
    differ = [line for line in lines if line.startswith("data differs")]
    assert len(differ) == 1 and differ[0].startswith("data differs, seed 0:")
    assert "algorithm=fedavg | algorithm=fedrep" in differ[0]


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
