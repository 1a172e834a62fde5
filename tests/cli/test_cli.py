"""Tiny end-to-end runs through the CLI: its main in this process, and the interpreter once."""

import json

import pytest

from conftest import main_in_process, run_dirs, summaries
from wandb_offline import history, run_info

pytestmark = pytest.mark.experiment

SMOKE = ("debug=smoke",)


@pytest.mark.parametrize("algorithm", ["fedavg", "fedprox", "fedrep"])
def test_every_spine_algorithm_runs(cli_in_process, algorithm):
    cli = cli_in_process
    proc = cli(f"algorithm={algorithm}", *SMOKE)
    assert f"{algorithm} on digits" in proc.stdout  # the final table
    (summary,) = summaries(cli.cwd / "outputs")
    assert summary["status"] == "completed" and summary["rounds_completed"] == 2
    key = "eval/personal/acc_mean" if algorithm == "fedrep" else "eval/global/acc"
    assert 0.0 <= summary["metrics"][key] <= 1.0
    assert summary["metrics"]["comm/up_bits_total"] > 0
    (run,) = run_dirs(cli.cwd / "outputs")
    lines = (run / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["round"] for line in lines] == [1, 2]
    stats = (run / "partition_stats.csv").read_text().splitlines()
    assert stats[0].startswith("client,group,n_train,n_test,n_val,class_0") and len(stats) == 7


def test_same_seed_gives_identical_metrics(cli_in_process):
    cli = cli_in_process
    cli(*SMOKE, "seed=5", "hydra.run.dir=a")
    cli(*SMOKE, "seed=5", "hydra.run.dir=b")
    a, b = (json.loads((cli.cwd / d / "summary.json").read_text()) for d in "ab")
    assert a["metrics"] == b["metrics"] and a["client_acc"] == b["client_acc"]


def test_two_job_multirun(cli_in_process):
    cli = cli_in_process
    cli("algorithm=fedavg,fedprox", *SMOKE, multirun=True)
    found = summaries(cli.cwd / "outputs" / "multirun")
    assert sorted(s["choices"]["algorithm"] for s in found) == ["fedavg", "fedprox"]


def test_wandb_offline_run_holds_the_accuracy(cli_in_process):
    cli = cli_in_process
    proc = cli(*SMOKE, "logger=wandb", "hydra.run.dir=w")
    (run_file,) = (cli.cwd / "w" / "wandb").glob("offline-run-*/run-*.wandb")
    # one line says W&B is offline and gives the command that uploads the run
    sync = f"W&B: offline; upload with: wandb sync {cli.cwd / 'w'}/wandb/offline-run-*"
    assert proc.stdout.count("W&B") == 1 and sync in proc.stdout
    rows = [r for r in history(run_file) if "eval/global/acc" in r]
    summary = json.loads((cli.cwd / "w" / "summary.json").read_text())
    assert [r["_step"] for r in rows] == [1, 2]
    assert rows[-1]["eval/global/acc"] == pytest.approx(summary["metrics"]["eval/global/acc"])
    info = run_info(run_file)
    assert (
        info["name"] == "fedavg debug=smoke s0"
        and info["group"] == "fedavg debug=smoke digits shards"
    )


def test_wandb_failure_never_stops_the_run(cli_in_process):
    cli = cli_in_process
    # an unknown mode makes wandb.init raise; the run must warn and finish
    cli(*SMOKE, "logger=wandb", "logger.wandb.mode=bogus", "hydra.run.dir=w")
    assert json.loads((cli.cwd / "w" / "summary.json").read_text())["status"] == "completed"


def test_hydra_introspection_works(cli_in_process):
    cli = cli_in_process
    proc = cli("--cfg", "job")
    assert "algorithm:" in proc.stdout and "fedexp.algorithms.fedavg.FedAvg" in proc.stdout


BAD_INPUTS = [
    (("clients_per_round=30",), "clients_per_round: must be in [1, num_clients=20], got 30"),
    (("client.lr=0",), "client.lr: must be > 0, got 0"),
    (("rounds=0",), "rounds: must be >= 1, got 0"),
    (("partition.classes_per_client=11",), "partition.classes_per_client: 11 exceeds"),
    (("client.optimizer=lbfgs",), "client.optimizer: must be one of"),
    (("dataset=cifar10", "dataset.data_dir=nowhere"), "dataset.data_dir: CIFAR-10 not found at"),
]


def test_bad_input_gives_one_line_error_and_no_run_dir(cli):
    # the interpreter's path once; the other inputs in-process (the same main())
    overrides, message = BAD_INPUTS[0]
    proc = cli(*overrides, check=False)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], proc.stderr
    assert not list((cli.cwd / "outputs").rglob("*.json"))
    assert not any(p.is_dir() for p in (cli.cwd / "outputs" / "runs").glob("*/*"))


@pytest.mark.parametrize("overrides,message", BAD_INPUTS[1:])
def test_bad_input_in_process_is_one_line_and_no_run_dir(
    overrides, message, tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FEDEXP_DATA_DIR", str(tmp_path / "data"))
    code, err = main_in_process(monkeypatch, capsys, *overrides)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and message in lines[0], err
    assert not list((tmp_path / "outputs").rglob("*.json"))
    assert not any(p.is_dir() for p in (tmp_path / "outputs" / "runs").glob("*/*"))


def test_unknown_option_is_hydras_error(cli_in_process):
    cli = cli_in_process
    proc = cli("algorithm=nope", check=False)
    assert proc.returncode != 0 and "nope" in proc.stderr
