"""A backdoor's success rate in the final table, the sweep table and the report (numbers by hand:
0.2/0.4 give mean 0.3, sample std 0.1414)."""

from __future__ import annotations

from pathlib import Path

from fedexp.cli_table import print_table
from fedexp.core.summary import Objective, RunSummary, Timing
from fedexp.report import Run, group_runs
from fedexp.report.tables import final_table
from fedexp.sweep import sweep_notes, sweep_rows

ASR = "attack/backdoor_asr"


def fake_run(fraction: float, seed: int, acc: float, asr: float) -> Run:
    summary = RunSummary(
        "completed",
        rounds_completed=10,
        metrics={"eval/global/acc": acc, ASR: asr},
        config={"seed": seed, "attack": {"fraction": fraction}},
        choices={"algorithm": "fedavg", "attack": "backdoor"},
        objective=Objective("eval/val/global/acc", acc),
        timing=Timing(1.0, 0.1),
    )
    return Run(Path(f"/s/{fraction}-{seed}"), summary)


RUNS = [fake_run(0.0, 0, 0.9, 0.0), fake_run(0.3, 0, 0.8, 0.2), fake_run(0.3, 1, 0.8, 0.4)]


def test_the_final_table_names_the_success_rate(capsys):
    print_table(RUNS[1].summary, {"algorithm": "fedavg", "dataset": "digits"})
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if ASR in line)
    assert "backdoor success, global model, triggered test inputs" in row and "0.2000" in row


def test_the_sweep_table_has_a_column_and_a_note_for_it():
    _, heads, rows = sweep_rows(RUNS)
    assert heads[-1] == ASR
    assert [row[-1] for row in rows] == ["0.0000", "0.3000 ± 0.1414"]
    note = [n for n in sweep_notes(heads, RUNS) if n.startswith(ASR)]
    assert note and "outside the attack's target class" in note[0]


def test_the_reports_final_table_has_the_column():
    groups, _ = group_runs(RUNS)
    table = final_table(groups)
    head, _, *rows = table.splitlines()
    assert ASR in head
    assert rows[1].split(" | ")[head.split(" | ").index(ASR)] == "0.3000 ± 0.1414"
