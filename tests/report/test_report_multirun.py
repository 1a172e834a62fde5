"""The report on a real 2-algorithm x 2-seed multirun: Markdown with mean ± std and PNGs."""

from __future__ import annotations

import sys

import pytest
import torch

pytestmark = pytest.mark.experiment


def test_report_of_a_two_algorithm_two_seed_multirun(tmp_path, monkeypatch, capsys):
    from fedexp.__main__ import main as fedexp_main
    from fedexp.report import main as report_main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FEDEXP_CACHE_DIR", str(tmp_path / "cache"))
    torch.set_num_threads(1)
    sweep = ["-m", "debug=smoke", "algorithm=fedavg,fedprox", "seed=0,1", "hydra.sweep.dir=sweep"]
    monkeypatch.setattr(sys, "argv", ["fedexp", *sweep])
    fedexp_main()
    assert report_main(["sweep"]) == 0
    md = (tmp_path / "sweep" / "report" / "report.md").read_text()
    assert "4 runs in 2 groups" in md and "Groups differ in: `algorithm`" in md
    rows = [line for line in md.splitlines() if line.startswith("| algorithm=")]
    # every run did its 2 rounds: the rounds column has no spread and shows no `± 0`
    assert rows[0].startswith("| algorithm=fedavg | 2 | 2 | ")
    assert rows[1].startswith("| algorithm=fedprox | 2 | 2 | ")
    assert " ± " in rows[0].split("|")[4]  # seeds differ in accuracy: mean ± sample std
    for png in ("acc_vs_round", "final_acc", "client_acc_box", "acc_vs_comm"):
        assert (tmp_path / "sweep" / "report" / f"{png}.png").read_bytes()[:4] == b"\x89PNG"


def test_report_of_a_run_without_client_test_splits(tmp_path, monkeypatch):
    # no local test split: the clients' accuracies are NaN (null in summary.json)
    import json

    from fedexp.__main__ import main as fedexp_main
    from fedexp.report import main as report_main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FEDEXP_CACHE_DIR", str(tmp_path / "cache"))
    torch.set_num_threads(1)
    args = ["experiment=frl_digits", "debug=smoke", "partition.test_fraction=0", "hydra.run.dir=r"]
    monkeypatch.setattr(sys, "argv", ["fedexp", *args])
    fedexp_main()
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["client_acc"]["global"] == [None] * 6
    assert summary["metrics"]["eval/global/client_acc_mean"] is None  # NaN, written as null
    assert report_main(["r"]) == 0
    md = (tmp_path / "r" / "report" / "report.md").read_text()
    head = next(line for line in md.splitlines() if "eval/global/client_acc_mean" in line)
    row = next(line for line in md.splitlines() if line.startswith("| frl |"))
    cells = dict(zip(head.split("|"), row.split("|")))
    clients = " test acc, global model, mean over clients (`eval/global/client_acc_mean`) "
    pooled = " test acc, global model, pooled (`eval/global/acc`) "
    assert cells[clients] == " – " and cells[pooled] != " – "
    assert not (tmp_path / "r" / "report" / "client_acc_box.png").exists()  # nothing to draw
    assert "- per-client accuracy: not recorded by frl (no box plot)" in md
    assert "- `eval/global/client_acc_mean`: null/NaN in frl (– in the table)" in md
