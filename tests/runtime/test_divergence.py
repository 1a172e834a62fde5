"""A non-finite loss stops a run cleanly: last good checkpoint kept, status diverged, exit 3;
in a multirun the other jobs go on."""

from __future__ import annotations

import json

import pytest
import torch

from conftest import main_in_process
from fedexp.runtime.checkpoint import CHECKPOINT_FILE

pytestmark = pytest.mark.experiment

# FedAvg on digits with client.lr=10 overflows within 4 rounds (train/loss ~1e21 after round 1)
EXPLODES = "client.lr=10"


def cli_in_process(tmp_path, monkeypatch, capsys, *args) -> tuple[int, str]:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FEDEXP_CACHE_DIR", str(tmp_path / "cache"))
    torch.set_num_threads(1)
    return main_in_process(monkeypatch, capsys, *args)


def test_a_diverged_run_keeps_its_last_good_checkpoint_and_exits_3(tmp_path, monkeypatch, capsys):
    args = ("debug=smoke", "rounds=4", "checkpoint_every=1", EXPLODES, "hydra.run.dir=run")
    code, err = cli_in_process(tmp_path, monkeypatch, capsys, *args)
    assert code == 3
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "diverged" and summary["diverged_round"] >= 2
    assert f"run diverged at round {summary['diverged_round']}" in err
    last_good = summary["diverged_round"] - 1
    assert summary["rounds_completed"] == summary["checkpoint_round"] == last_good
    payload = torch.load(tmp_path / "run" / CHECKPOINT_FILE, weights_only=True)
    assert payload["round"] == last_good
    assert bool(torch.isfinite(payload["server"]["params"]).all())


def test_in_a_multirun_the_other_job_goes_on(tmp_path, monkeypatch, capsys):
    args = ("-m", "debug=smoke", "rounds=4", "client.lr=0.05,10", "hydra.sweep.dir=sweep")
    code, _ = cli_in_process(tmp_path, monkeypatch, capsys, *args)
    assert code == 0
    found = [json.loads((tmp_path / "sweep" / j / "summary.json").read_text()) for j in "01"]
    assert [s["status"] for s in found] == ["completed", "diverged"]
    assert [s["config"]["client"]["lr"] for s in found] == [0.05, 10.0]
