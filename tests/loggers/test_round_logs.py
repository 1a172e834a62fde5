"""Every round is logged (train loss, round time, communication), evaluated rounds add the
evaluation; plain progress lines come at most `every_s` seconds apart (a fake clock); a sweep's
progress lines are prefixed with the values it varies."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from components import with_yaml
from fedexp.algorithms.fedavg import FedAvg
from fedexp.attacks import NoAttack
from fedexp.core.callbacks import RoundReport, RunInfo
from fedexp.engine.executors.sequential import SequentialExecutor
from fedexp.engine.orchestrator import Orchestrator
from fedexp.loggers import progress
from fedexp.loggers.files import CSVLogger, RunRecorder
from fedexp.loggers.progress import ProgressLines, run_label
from fedexp.loggers.wandb_labels import swept_values
from fedexp.loggers.wandb_logger import WandbLogger
from handworld import make_ctx, two_client_data


def test_every_round_is_logged_and_evaluated_rounds_add_the_evaluation(tmp_path):
    data = two_client_data()
    algorithm = with_yaml(FedAvg, "algorithm", "fedavg")(make_ctx(data))
    loggers = [RunRecorder(tmp_path), CSVLogger(tmp_path)]
    orch = Orchestrator(
        algorithm, SequentialExecutor(), data, with_yaml(NoAttack, "attack", "none")(), seed=0,
        rounds=5, clients_per_round=2, eval_every=3, callbacks=loggers,
    )  # fmt: skip
    orch.run()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [1, 2, 3, 4, 5]
    # round 1 starts from the zero model: softmax 1/2, each client's one step has loss ln 2
    assert rows[0]["train/loss"] == pytest.approx(math.log(2))
    assert all(r["train/loss"] < math.log(2) for r in rows[1:])
    assert all(r["time/round_s"] > 0 for r in rows)
    assert sum(r["time/round_s"] for r in rows) == pytest.approx(orch.train_seconds)
    # the evaluation's metrics on evaluated rounds only (3, and the last)
    assert [r["round"] for r in rows if "eval/global/acc" in r] == [3, 5]
    assert [r["comm/up_bits_total"] for r in rows] == [rows[0]["comm/up_bits"] * t for t in
                                                       range(1, 6)]  # fmt: skip
    with (tmp_path / "metrics.csv").open(newline="") as f:
        table = list(csv.DictReader(f))
    assert [r["round"] for r in table] == ["1", "2", "3", "4", "5"]
    assert [r["eval/global/acc"] != "" for r in table] == [False, False, True, False, True]
    assert float(table[0]["train/loss"]) == pytest.approx(math.log(2))


class FakeRun:
    def __init__(self):
        self.rows: list[tuple[int, dict]] = []

    def define_metric(self, *args, **kwargs):
        pass

    def log(self, row, step):
        self.rows.append((step, row))


def test_wandb_logs_every_round_and_a_histogram_on_evaluated_rounds(tmp_path, monkeypatch):
    options = OmegaConf.load(Path(__file__).parents[2] / "conf/logger/wandb.yaml").wandb
    options = {k: v for k, v in options.items() if k != "_target_"}
    logger = WandbLogger(tmp_path, **{**options, "mode": "disabled"})
    logger.run = FakeRun()
    monkeypatch.setattr(WandbLogger, "histogram", staticmethod(lambda accs: ("hist", len(accs))))
    logger.on_round_end(RoundReport(1, 2, {"train/loss": 0.7, "time/round_s": 1.5}, False, None))
    accs = {"global": [0.5, 0.75]}
    logger.on_round_end(RoundReport(2, 2, {"train/loss": 0.6, "eval/global/acc": 0.6}, True,
                                    None, client_accs=accs))  # fmt: skip
    assert logger.run.rows == [
        (1, {"round": 1, "train/loss": 0.7, "time/round_s": 1.5}),
        (2, {"round": 2, "train/loss": 0.6, "eval/global/acc": 0.6,
             "eval/global/client_acc_hist": ("hist", 2)}),
    ]  # fmt: skip


# ---- progress lines at most every_s seconds apart ----------------------------------------------
@pytest.fixture
def clock(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(progress.time, "perf_counter", lambda: now[0])
    return now


def lines_at(clock, capsys, every_s, seconds_per_round, eval_every=10, rounds=20) -> list[str]:
    """The progress lines of `rounds` rounds of `seconds_per_round` each (train loss 1/round)."""
    lines = ProgressLines("eval/val/global/acc", every_s=every_s)
    lines.on_run_start(RunInfo(Path("/r"), {}, "fedavg-digits-s0", None, rounds))
    capsys.readouterr()
    for t in range(1, rounds + 1):
        clock[0] += seconds_per_round
        evaluated = t % eval_every == 0 or t == rounds
        metrics = {"train/loss": 1 / t, **({"eval/val/global/acc": 0.5} if evaluated else {})}
        lines.on_round_end(RoundReport(t, rounds, metrics, evaluated, None))
    return capsys.readouterr().out.splitlines()


def test_quick_rounds_get_a_line_about_every_30_s_and_on_evaluations(clock, capsys):
    # 4 s rounds: 32 s after the start line at round 8; round 10 is evaluated; 32 s later at 18
    out = lines_at(clock, capsys, every_s=30, seconds_per_round=4.0)
    assert [line.split()[1] for line in out] == ["8/20", "10/20", "18/20", "20/20"]
    assert out[0] == "round 8/20  train/loss 0.1250  4.00 s/round  ETA 48s"
    assert out[1] == (
        "round 10/20  train/loss 0.1000  eval/val/global/acc 0.5000  4.00 s/round  ETA 40s"
    )


def test_slow_rounds_get_a_line_each(clock, capsys):
    out = lines_at(clock, capsys, every_s=30, seconds_per_round=45.0, rounds=4)
    assert [line.split()[1] for line in out] == ["1/4", "2/4", "3/4", "4/4"]
    assert out[0] == "round 1/4  train/loss 1.0000  45.00 s/round  ETA 2m15s"


def test_zero_is_every_round_and_none_the_evaluated_rounds_only(clock, capsys):
    every = lines_at(clock, capsys, every_s=0, seconds_per_round=0.1, eval_every=3, rounds=5)
    assert [line.split()[1] for line in every] == ["1/5", "2/5", "3/5", "4/5", "5/5"]
    evaluated = lines_at(clock, capsys, every_s=None, seconds_per_round=60.0, eval_every=3,
                         rounds=5)  # fmt: skip
    assert [line.split()[1] for line in evaluated] == ["3/5", "5/5"]


# ---- a sweep job's label -----------------------------------------------------------------------
CHOICES = {"algorithm": "fedprox", "dataset": "digits", "partition": "shards"}


def job_dir(tmp_path: Path, task: list[str], sweep: list[str], mode="MULTIRUN", **sweeper) -> Path:
    """A job dir with the files Hydra writes: `.hydra/hydra.yaml` (the job's overrides, its
    choices, the sweeper) and, in a multirun, the sweep dir's `multirun.yaml`."""
    run_dir = tmp_path / "sweep" / "3"
    (run_dir / ".hydra").mkdir(parents=True)
    choices = {**CHOICES, "hydra/sweeper": "basic"}
    for override in task:  # a swept group choice is the job's choice
        key, _, value = override.partition("=")
        choices.update({key: value} if key in choices else {})
    hydra = {
        "mode": mode,
        "overrides": {"task": task},
        "runtime": {"choices": choices},
        "sweeper": sweeper,
    }
    OmegaConf.save({"hydra": hydra}, run_dir / ".hydra" / "hydra.yaml")
    OmegaConf.save({"hydra": {"overrides": {"task": sweep}}}, run_dir.parent / "multirun.yaml")
    return run_dir


def label(run_dir: Path, seed: int = 0) -> str:
    hydra = OmegaConf.load(run_dir / ".hydra" / "hydra.yaml").hydra
    choices = {k: v for k, v in hydra.runtime.choices.items() if not k.startswith("hydra")}
    return run_label(choices, seed, swept_values(run_dir))


def test_a_sweep_job_is_labelled_by_the_values_its_sweep_varies(tmp_path):
    task = ["algorithm=fedprox", "algorithm.mu=0.01", "seed=1", "rounds=5", "partition=iid"]
    sweep = ["algorithm=fedprox", "algorithm.mu=0.001,0.01", "seed=0,1", "rounds=5",
             "partition=shards,iid"]  # fmt: skip
    assert label(job_dir(tmp_path, task, sweep), seed=1) == "fedprox-digits-mu0.01-iid-s1"


def test_an_optuna_trial_is_labelled_by_its_sampled_values(tmp_path):
    task = ["hparams_search=fedprox_mu", "algorithm.mu=0.0187381", "client.lr=0.05"]
    params = {"algorithm.mu": "interval(0.001, 1)", "client.lr": "interval(0.005, 0.5)"}
    run_dir = job_dir(tmp_path, task, ["hparams_search=fedprox_mu"], params=params)
    assert label(run_dir) == "fedprox-digits-mu0.01874-lr0.05-s0"


def test_a_single_run_is_labelled_without_its_overrides(tmp_path):
    run_dir = job_dir(tmp_path, ["algorithm.mu=0.01"], [], mode="RUN")
    assert label(run_dir) == "fedprox-digits-s0"
    assert swept_values(tmp_path / "no_hydra_files") == []
