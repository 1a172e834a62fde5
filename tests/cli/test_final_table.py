"""The final table's title and best round, and a sweep's grouped table.

Numbers are chosen to be checked by hand: objective values 0.5/0.7 (mean 0.6, sample std
(ddof = 1) 0.1414, as in the report).
"""

from __future__ import annotations

import json
from pathlib import Path

from fedexp.__main__ import best_round, run_title
from fedexp.core.summary import Objective, RunSummary, Timing
from fedexp.report import Run
from fedexp.sweep import sweep_rows


def test_the_title_names_the_run_and_the_overrides_that_matter():
    choices = {"algorithm": "fedprox", "dataset": "cifar10"}
    overrides = ["algorithm=fedprox", "algorithm.mu=0.01", "+client.lr=0.1", "seed=1",
                 "device=cpu", "progress=false", "logger=wandb", "hydra.run.dir=x"]  # fmt: skip
    assert (
        run_title(choices, overrides)
        == "fedprox on cifar10 (algorithm.mu=0.01 client.lr=0.1 seed=1)"
    )
    assert run_title(choices) == "fedprox on cifar10"


def test_best_round_is_the_highest_accuracy_or_the_lowest_loss(tmp_path):
    rows = [
        {"round": 5, "eval/val/global/acc": 0.6, "train/loss": 0.9},
        {"round": 10, "eval/val/global/acc": 0.8, "train/loss": 0.5},
        {"round": 15, "eval/val/global/acc": 0.8, "train/loss": 0.7},  # a tie: the earlier
        {"round": 20, "eval/val/global/acc": 0.7, "train/loss": 0.6},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + "{half")
    assert best_round(tmp_path, "eval/val/global/acc") == (10, 0.8)
    assert best_round(tmp_path, "train/loss") == (10, 0.5)
    assert best_round(tmp_path, "eval/personal/acc_mean") is None
    assert best_round(tmp_path / "none", "train/loss") is None


def fake_run(lr: float, seed: int, value: float | None, status: str = "completed") -> Run:
    summary = RunSummary(
        status,
        rounds_completed=10,
        metrics={"eval/global/acc": value} if value is not None else {},
        config={"seed": seed, "client": {"lr": lr}},
        choices={"algorithm": "fedavg"},
        objective=Objective("eval/val/global/acc", value),
        timing=Timing(1.0, 0.1),
    )
    return Run(Path(f"/s/{lr}-{seed}"), summary)


def test_the_sweep_table_is_mean_and_sample_std_over_seeds():
    runs = [
        fake_run(0.1, 0, 0.5),
        fake_run(0.1, 1, 0.7),
        fake_run(0.01, 0, 0.2),
        fake_run(0.01, 1, 0.4),
        fake_run(0.01, 2, None, status="diverged"),  # counted, not averaged
    ]
    keys, heads, rows = sweep_rows(runs)
    assert keys == ["client.lr"]
    assert heads == ["group", "runs", "objective: eval/val/global/acc", "eval/global/acc"]
    assert rows == [
        ["client.lr=0.01", "2 (+1 diverged)", "0.3000 ± 0.1414", "0.3000 ± 0.1414"],
        ["client.lr=0.1", "2", "0.6000 ± 0.1414", "0.6000 ± 0.1414"],
    ]
