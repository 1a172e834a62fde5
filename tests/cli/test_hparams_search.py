"""Every hparams_search preset runs an Optuna search at smoke size and returns the objective."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
import yaml

pytestmark = pytest.mark.experiment

REPO = Path(__file__).resolve().parents[2]
PRESETS = sorted(p.stem for p in (REPO / "conf" / "hparams_search").glob("*.yaml"))


@pytest.mark.parametrize("preset", PRESETS)
def test_a_two_trial_search_records_the_best_trial(tmp_path, monkeypatch, preset):
    from fedexp.__main__ import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FEDEXP_CACHE_DIR", str(tmp_path / "cache"))
    torch.set_num_threads(1)
    args = [f"hparams_search={preset}", "debug=smoke", "hydra.sweeper.n_trials=2"]
    monkeypatch.setattr(sys, "argv", ["fedexp", *args, "hydra.sweep.dir=search"])
    main()
    results = yaml.safe_load((tmp_path / "search" / "optimization_results.yaml").read_text())
    found = sorted((tmp_path / "search").glob("*/summary.json"))
    trials = [json.loads(p.read_text()) for p in found]
    assert len(trials) == 2
    objective = trials[0]["config"]["objective"]
    values = [t["metrics"][objective] for t in trials]
    assert results["best_value"] == pytest.approx(max(values))
    best = trials[values.index(max(values))]["config"]
    for key, value in results["best_params"].items():  # e.g. algorithm.mu, client.lr
        section, name = key.split(".")
        assert best[section][name] == pytest.approx(value)


@pytest.mark.parametrize(
    "args, problem",
    [  # FRL's presets keep no validation split; a search never tunes on the test set
        (
            ["hparams_search=frl_k", "experiment=frl_digits"],
            "objective: eval/val/global/acc needs validation data and partition.val_fraction is 0",
        ),
        (
            ["hparams_search=fedprox_mu", "objective=auto", "partition.val_fraction=0"],
            "objective: auto needs validation data",
        ),
        (["hparams_search=fedprox_mu", "objective=none"], "objective: none; a search needs one"),
    ],
)
def test_a_search_without_validation_data_is_refused_before_any_trial(
    tmp_path, monkeypatch, capsys, args, problem
):
    from conftest import main_in_process

    monkeypatch.chdir(tmp_path)
    code, err = main_in_process(monkeypatch, capsys, *args, "debug=smoke", "hydra.sweep.dir=s")
    assert code == 2
    assert err.strip().startswith(f"fedexp: error: {problem}") and len(err.splitlines()) == 1
    assert not (tmp_path / "s").exists()  # no trial ran, no study was stored
