"""Smoke runs through the real CLI: FRL, SignSGD, TopK, every aggregator, every attack at 20%.

Each CLI process costs seconds of imports, so the cases run as Hydra multiruns (one process), on
a small MLP; the sweeps over every aggregator and attack are marked slow.
"""

from __future__ import annotations

import json
import math
import re
import sys

import pytest

from conftest import summaries

SMALL = ("debug=smoke", "num_clients=10", "clients_per_round=5", "logger={}", "model.hidden=[16]")


@pytest.mark.slow  # three CLI runs; the units cover each algorithm; make test-full
def test_frl_signsgd_topk(cli):
    cli(*SMALL, "algorithm=frl,signsgd,topk", multirun=True)
    runs = summaries(cli.cwd)
    assert [r["status"] for r in runs] == ["completed"] * 3
    for run in runs:
        metrics = run["metrics"]
        assert metrics["comm/up_bits_total"] > 0 and metrics["comm/down_bits_total"] > 0
        assert 0 <= metrics["eval/global/acc"] <= 1
        assert "eval/global/client_acc_std" in metrics and "attack/fraction" in metrics
    frl = [r for r in runs if r["choices"]["algorithm"] == "frl"][0]
    assert frl["choices"]["aggregator"] == "rank_vote"
    assert frl["metrics"]["comm/up_bits_total"] == frl["metrics"]["comm/down_bits_total"]


@pytest.mark.slow
def test_every_aggregator(cli):
    cli(*SMALL, "aggregator=trimmed_mean,multikrum,median,sign_vote", multirun=True)
    assert [r["status"] for r in summaries(cli.cwd)] == ["completed"] * 4


@pytest.mark.slow
def test_every_attack_at_twenty_percent(cli):
    attacks = "agr_tailored,min_max,min_sum,scaling,label_flip,lie,sign_flip"
    cli(*SMALL, f"attack={attacks}", "attack.fraction=0.2", multirun=True)
    cli(*SMALL, "algorithm=frl", "attack=rank_reversal", "attack.fraction=0.2")
    cli(*SMALL, "algorithm=signsgd", "attack=sign_flip", "attack.fraction=0.2")
    runs = summaries(cli.cwd)
    assert [r["status"] for r in runs] == ["completed"] * 9
    names = {r["describe"]["attack/name"] for r in runs}
    assert names == {"rank_reversal", *attacks.split(",")}
    for run in runs:
        assert run["describe"]["attack/num_malicious"] == 2
        assert run["metrics"]["attack/fraction"] == 0.2


@pytest.mark.slow
def test_config_error_exits_2(cli):
    proc = cli(*SMALL, "algorithm=frl", "aggregator=trimmed_mean", check=False)
    assert proc.returncode == 2 and "needs aggregator=rank_vote" in proc.stderr


@pytest.mark.experiment
def test_frl_preset_reports_client_accuracies_and_no_objective(tmp_path, monkeypatch, capsys):
    # each client's local test split gives the clients' accuracies of FRL's Tables 2 and 4; no
    # validation split, so `objective: auto` is none: never the test accuracy
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FEDEXP_CACHE_DIR", str(tmp_path / "cache"))
    from fedexp.__main__ import main

    args = ["experiment=frl_digits_attack20", "debug=smoke", "hydra.run.dir=run"]
    monkeypatch.setattr(sys, "argv", ["fedexp", *args])
    main()
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    metrics = summary["metrics"]
    assert summary["config"]["partition"]["test_fraction"] == 0.2
    assert summary["config"]["objective"] == "auto"
    assert summary["objective"] == {"name": "none", "value": None}
    for stat in ("mean", "std", "min", "max"):
        assert math.isfinite(metrics[f"eval/global/client_acc_{stat}"])
    assert 0 <= metrics["eval/global/client_acc_min"] <= metrics["eval/global/client_acc_max"]
    assert all(math.isfinite(a) for a in summary["client_acc"]["global"])
    assert 0 <= metrics["eval/global/acc"] <= 1  # the central test set
    table = capsys.readouterr().out  # the final table
    assert re.search(r"objective: none\s+│\s+no validation data", table)
