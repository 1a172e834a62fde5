"""`logger=wandb` writes the run dir's files as `logger=csv` does: `metrics.csv` too."""

from __future__ import annotations

import csv
import json

import pytest

# a run through the command line's main
pytestmark = pytest.mark.cli


def csv_rows(run_dir) -> list[dict]:
    with (run_dir / "metrics.csv").open(newline="") as f:
        return list(csv.DictReader(f))


def test_a_wandb_run_writes_metrics_csv_as_a_csv_run(cli_in_process):
    cli_in_process("debug=smoke", "logger=wandb", "hydra.run.dir=w")
    cli_in_process("debug=smoke", "logger=csv", "hydra.run.dir=c")
    w, c = cli_in_process.cwd / "w", cli_in_process.cwd / "c"
    assert list((w / "wandb").glob("offline-run-*"))  # W&B logged too
    rows = csv_rows(w)
    jsonl = [json.loads(line) for line in (w / "metrics.jsonl").read_text().splitlines()]
    assert [int(r["round"]) for r in rows] == [r["round"] for r in jsonl] == [1, 2]
    assert list(rows[0]) == list(csv_rows(c)[0])  # the same columns
    assert float(rows[-1]["eval/global/acc"]) == jsonl[-1]["eval/global/acc"]
