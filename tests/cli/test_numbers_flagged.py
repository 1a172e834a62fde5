"""Through the CLI: what changes what a number means is shown where the number is (the final
table, summary.json, the sweep table, report.md), and a preset sweep's groups are labelled by
the swept values alone."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.experiment


def sweep(monkeypatch, tmp_path, *args: str) -> None:
    from fedexp.__main__ import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FEDEXP_CACHE_DIR", str(tmp_path / "cache"))
    torch.set_num_threads(1)
    argv = ["fedexp", "-m", "debug=smoke", "device=cpu", *args, "hydra.sweep.dir=sweep"]
    monkeypatch.setattr(sys, "argv", argv)
    main()


def test_malicious_majority_rounds_are_counted_in_the_table_and_summary(cli_in_process):
    # 3 of 6 clients malicious, cohorts of 3: about half the rounds are theirs
    proc = cli_in_process("debug=smoke", "algorithm=frl", "attack=rank_reversal",
                          "attack.fraction=0.5", "rounds=6", "hydra.run.dir=run")  # fmt: skip
    summary = json.loads((cli_in_process.cwd / "run" / "summary.json").read_text())
    rows = [json.loads(line) for line in (cli_in_process.cwd / "run" / "metrics.jsonl").open()]
    flagged = sum(r.get("attack/malicious_majority", 0) for r in rows if "train/loss" in r)
    assert flagged >= 1
    (line,) = [w for w in summary["warnings"] if "malicious majority" in w]
    assert line.startswith(f"{flagged} of 6 rounds had a malicious majority")
    assert "attack.redraw_majority=true" in line
    assert f"warning: {flagged} of 6 rounds had a malicious majority" in proc.stdout
    redrawn = cli_in_process("debug=smoke", "algorithm=frl", "attack=rank_reversal",
                             "attack.fraction=0.3", "attack.redraw_majority=true", "rounds=6",
                             "hydra.run.dir=run2")  # fmt: skip
    assert "malicious majority" not in redrawn.stdout


def test_the_default_run_withholds_nothing_and_says_what_the_clients_hold(cli_in_process):
    proc = cli_in_process("debug=smoke", "hydra.run.dir=run")
    summary = json.loads((cli_in_process.cwd / "run" / "summary.json").read_text())
    assert summary["metrics"]["data/server_pool"] == 0
    assert summary["metrics"]["data/held_by_clients"] == 1.0  # digits: every training sample
    assert summary["config"]["partition"]["server_pool"] == 0  # `auto`, resolved
    assert len(summary["data_fingerprint"]) == 40
    assert "training data the clients hold" in proc.stdout and "100.0%" in proc.stdout


def test_a_preset_sweep_is_labelled_by_the_swept_values_and_warns_per_group(
    tmp_path, monkeypatch, capsys
):
    sweep(monkeypatch, tmp_path, "experiment=frl_digits_attack20", "algorithm=frl,fedrep",
          "client.local_epochs=1", "attack=none", "attack.fraction=0")  # fmt: skip
    out = capsys.readouterr().out
    assert "2 runs in 2 groups, differing in algorithm" in out
    assert "_target_" not in out and "pool_size" not in out and "client=" not in out
    # FedRep at E = 1: one head epoch of its own, shown beside the numbers
    (warned,) = [line for line in out.splitlines() if line.startswith("warning, algorithm=fedrep")]
    assert "1 head + 1 body epochs a round" in warned
    report = (Path(tmp_path) / "sweep" / "report" / "report.md").read_text()
    assert "| algorithm=frl |" in report and "## Warnings" in report
    assert "- warning, algorithm=fedrep: FedRep: 1 head + 1 body epochs" in report
    # losses beside accuracies: in the final table and as a figure
    assert "test loss, global model, pooled (`eval/global/loss`)" in report
    assert "test loss, personal models, mean over clients (`eval/personal/loss_mean`)" in report
    assert "## Loss vs round" in report
    assert (Path(tmp_path) / "sweep" / "report" / "loss_vs_round.png").exists()
