"""A LightningModule written as Lightning's docs write one trains as a fedexp client (CLI)."""

import json
import os

import pytest

from conftest import REPO, run_cli
from datafiles import write_mnist

# the docs' LitModel reads 28x28 images: MNIST files of the real layout, small
USER = ("dataset=mnist", "model=lightning", "debug=smoke", "client.batch_size=4", "client.lr=0.002")
ENV = {"PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO / "tests")])}


@pytest.fixture
def mnist_cli(tmp_path):
    write_mnist(tmp_path / "data" / "mnist", "MNIST", n_train=120, n_test=20)

    def _run(name: str, *overrides: str, check: bool = True):
        return run_cli(
            *USER, *overrides, f"hydra.run.dir={name}", cwd=tmp_path, env=ENV, check=check
        )

    _run.cwd = tmp_path
    return _run


def rows(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def without_time(row: dict) -> dict:
    return {k: v for k, v in row.items() if not k.startswith("time/")}


@pytest.mark.slow  # 35-40 s of CLI runs; make test-full
def test_docs_module_under_fedavg_and_fedprox(mnist_cli):
    lit = "model._target_=lightning_docs_model.LitModel"
    mnist_cli("avg", lit, "algorithm=fedavg")
    mnist_cli("prox0", lit, "algorithm=fedprox", "algorithm.mu=0")
    mnist_cli("prox", lit, "algorithm=fedprox", "algorithm.mu=0.5")
    avg, prox0, prox = (rows(mnist_cli.cwd / d) for d in ("avg", "prox0", "prox"))
    assert [r["round"] for r in avg] == [1, 2]
    for row in avg:
        # FedAvg's loss is the module's task loss: the same per-client step means, averaged
        # over the same cohort, so the logged metric is train/loss to the bit
        assert row["client/train_loss"] == row["train/loss"]
    # FedProx with mu=0 adds nothing around the user's loss
    assert [without_time(r) for r in prox0] == [without_time(r) for r in avg]
    for row in prox:
        # the logged value is the user's task loss; train/loss adds the proximal term, > 0
        # after each client's first step (clients take several steps of 4 samples)
        assert 0 < row["client/train_loss"] < row["train/loss"]


@pytest.mark.slow  # two CLI runs (~30 s); make test-full
def test_fedrep_needs_a_head_and_a_body(mnist_cli):
    proc = mnist_cli(
        "rep", "model._target_=lightning_docs_model.LitModel", "algorithm=fedrep", check=False
    )
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()[-1:]
    assert line.startswith("fedexp: error: model: FedRep trains a personal `head`")
    assert "LitModel" in line
    assert not (mnist_cli.cwd / "rep").exists()  # refused before any training
    mnist_cli(
        "rep_ok",
        "model._target_=lightning_docs_model.LitBodyHead",
        "+model.hidden=16",
        "algorithm=fedrep",
        "client.optimizer=module",
    )
    for row in rows(mnist_cli.cwd / "rep_ok"):
        assert 0 <= row["client/train_acc"] <= 1 and row["client/train_loss"] > 0
