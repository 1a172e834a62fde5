"""A W&B dashboard that compares: a sweep's offline runs read back from their run files."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
import torch

from conftest import run_dirs
from wandb_offline import (
    artifacts,
    history,
    history_item,
    metric_definitions,
    run_info,
    summary,
)

# a sweep through the command line's main
pytestmark = pytest.mark.cli

SWEEP = ["debug=smoke", "algorithm=fedprox", "algorithm.mu=0.01,0.1", "seed=0,1", "logger=wandb"]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """A 2 mu x 2 seed FedProx sweep logged offline: [(run dir, run file, summary.json)]."""
    from fedexp.__main__ import main

    root = tmp_path_factory.mktemp("sweep")
    mp = pytest.MonkeyPatch()
    mp.chdir(root)
    mp.setenv("FEDEXP_CACHE_DIR", str(root / "cache"))
    mp.setenv("WANDB_MODE", "offline")
    mp.setattr(sys, "argv", ["fedexp", "-m", *SWEEP, "hydra.sweep.dir=sweep"])
    torch.set_num_threads(1)
    try:
        main()
    finally:
        mp.undo()
    jobs = []
    for run in run_dirs(root / "sweep"):
        (run_file,) = (run / "wandb").glob("offline-run-*/run-*.wandb")
        jobs.append((run, run_file, json.loads((run / "summary.json").read_text())))
    assert len(jobs) == 4
    return jobs


@pytest.mark.experiment
def test_seeds_share_a_group_and_settings_do_not(sweep):
    infos = [run_info(f) for _, f, _ in sweep]
    # Hydra's job order: mu=0.01 seed 0, 1, then mu=0.1 seed 0, 1
    assert [i["group"] for i in infos] == [
        "fedprox debug=smoke mu=0.01 digits shards",
        "fedprox debug=smoke mu=0.01 digits shards",
        "fedprox debug=smoke mu=0.1 digits shards",
        "fedprox debug=smoke mu=0.1 digits shards",
    ]
    # the name: what the sweep varies, and the seed
    names = ["fedprox mu=0.01 s0", "fedprox mu=0.01 s1", "fedprox mu=0.1 s0", "fedprox mu=0.1 s1"]
    assert [i["name"] for i in infos] == names
    assert {i["job_type"] for i in infos} == {"fedprox"}
    assert all(i["tags"] == ["sweep:sweep", "dataset:digits"] for i in infos)


@pytest.mark.experiment
def test_the_config_holds_the_hydra_choices_and_overrides(sweep):
    _, run_file, saved = sweep[2]
    config = run_info(run_file)["config"]
    assert config["choices"]["algorithm"] == "fedprox" and config["choices"]["dataset"] == "digits"
    assert "algorithm.mu=0.1" in config["overrides"] and "seed=0" in config["overrides"]
    assert config["algorithm"]["mu"] == 0.1 == saved["config"]["algorithm"]["mu"]
    # the objective as resolved (`objective: auto` in the config the run was given)
    assert saved["config"]["objective"] == "auto"
    assert config["objective"] == saved["objective"]["name"] == "eval/val/global/acc"


@pytest.mark.experiment
def test_round_is_the_step_and_accuracies_keep_their_best(sweep):
    _, run_file, saved = sweep[0]
    defs = metric_definitions(run_file)
    assert defs["*"] == ("round", [])
    assert defs["eval/global/acc"] == ("round", ["last", "max"])
    assert defs["eval/val/global/acc"] == ("round", ["last", "max"])
    assert "eval/global/client_acc_std" not in defs  # a spread has no "best"
    rows = [r for r in history(run_file) if "eval/global/acc" in r]
    assert [r["round"] for r in rows] == [r["_step"] for r in rows] == [1, 2]
    accs = [r["eval/global/acc"] for r in rows]
    best = summary(run_file)["eval/global/acc"]
    assert best == {"max": max(accs), "last": accs[-1]}
    assert accs[-1] == pytest.approx(saved["metrics"]["eval/global/acc"])


@pytest.mark.experiment
def test_each_evaluation_logs_a_histogram_of_client_accuracies(sweep):
    _, run_file, saved = sweep[1]
    hists = history_item(run_file, "eval/global/client_acc_hist")
    assert len(hists) == 2  # rounds 1 and 2 are both evaluated at debug=smoke
    assert hists[-1]["bins"] == pytest.approx(np.linspace(0, 1, 21).tolist())
    final = saved["client_acc"]["global"]
    assert len(final) == 6 and sum(hists[-1]["values"]) == 6  # every client, once
    expected, _ = np.histogram(final, bins=20, range=(0, 1))
    assert hists[-1]["values"] == expected.tolist()


@pytest.mark.experiment
def test_the_partition_statistics_are_a_table(sweep):
    run, run_file, _ = sweep[0]
    (table,) = history_item(run_file, "partition/class_counts")
    stats = (run / "partition_stats.csv").read_text().splitlines()
    assert table["_type"] == "table-file"
    assert table["nrows"] == len(stats) - 1 == 6 and table["ncols"] == len(stats[0].split(","))


@pytest.mark.slow  # three W&B CLI runs (~40 s); make test-full
def test_the_console_is_quiet_unless_verbose_and_the_checkpoint_is_an_artifact(cli):
    loud = {"WANDB_SILENT": "false"}  # W&B's own default: a dozen `wandb:` lines a job
    quiet = cli("debug=smoke", "logger=wandb", "hydra.run.dir=q", env=loud)
    assert not [
        line for line in (quiet.stdout + quiet.stderr).splitlines() if line.startswith("wandb:")
    ]
    verbose = cli(
        "debug=smoke",
        "logger=wandb",
        "logger.wandb.verbose=true",
        "logger.wandb.log_checkpoint=true",
        "checkpoint_every=1",
        "hydra.run.dir=v",
        env=loud,
    )
    assert "wandb:" in verbose.stdout + verbose.stderr
    (run_file,) = (cli.cwd / "v" / "wandb").glob("offline-run-*/run-*.wandb")
    (artifact,) = [a for a in artifacts(run_file) if a["type"] == "model"]
    assert artifact["metadata"] == {"round": 2}  # the last round's
    assert artifact["name"] == f"checkpoint-{run_info(run_file)['id']}"


@pytest.mark.experiment
def test_the_run_summary_carries_the_warnings_and_the_data_fingerprint(sweep):
    for _, run_file, saved in sweep:
        got = summary(run_file)
        assert got["warnings"] == (" | ".join(saved["warnings"]) or "none")
        assert got["data_fingerprint"] == saved["data_fingerprint"] and got["data_fingerprint"]
