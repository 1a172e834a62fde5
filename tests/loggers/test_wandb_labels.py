"""W&B labels from Hydra's job files: short values, what a sweep varies, group and name."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from fedexp.config.build import labelled_choices
from fedexp.loggers.wandb_labels import (
    MAX_GROUP,
    group_name,
    labels_from_run_dir,
    short_keys,
    short_value,
    sweep_keys,
)

# the labels of the command line's runs, from the Hydra job files they write
pytestmark = pytest.mark.cli

CHOICES = {"algorithm": "fedprox", "dataset": "digits", "partition": "shards"}


def test_values_are_short_and_integers_stay_integers():
    assert short_value("0.018738174228603841") == "0.01874"
    assert short_value("0.1") == "0.1" and short_value("1e-3") == "0.001"
    assert short_value("50") == "50" and short_value("smoke") == "smoke"


def test_keys_are_their_last_part_unless_two_clash():
    keys = ["algorithm.mu", "client.lr", "attack.lr"]
    assert short_keys(keys) == {
        "algorithm.mu": "mu",
        "client.lr": "client.lr",
        "attack.lr": "attack.lr",
    }


def test_a_sweep_varies_its_lists_ranges_and_optuna_params():
    overrides = ["debug=smoke", "algorithm=fedavg,fedprox", "seed=range(3)", "rounds=5"]
    params = {"algorithm.mu": "tag(log, interval(0.001, 1.0))"}
    assert sweep_keys(overrides, params) == {"algorithm", "seed", "algorithm.mu"}


def test_the_group_leaves_out_the_seed_and_what_does_not_change_results():
    overrides = ["algorithm=fedprox", "algorithm.mu=0.01", "seed=3", "device=cpu", "logger=wandb"]
    assert group_name(overrides, CHOICES) == "fedprox mu=0.01 digits shards"
    # the evaluation schedule, checkpoints, logger options, files, devices and the executor
    io = ["eval_every=1", "checkpoint_every=0", "+logger.wandb.tags=[a]", "threads=2"]
    io += ["hydra.run.dir=x", "hydra.sweep.dir=y", "executor=vectorized", "executor.chunk_size=4"]
    io += ["paths.cache_dir=/c", "progress=false", "client_store.max_bytes=1GB", "objective=auto"]
    assert group_name([*overrides, *io], CHOICES) == "fedprox mu=0.01 digits shards"
    # what defines the results stays: rounds, the smoke shrink, a client setting
    kept = ["rounds=5", "debug=smoke", "client.lr=0.1", "eval.personal_clients=4"]
    assert group_name([*kept, *io], CHOICES) == (
        "fedprox rounds=5 debug=smoke lr=0.1 personal_clients=4 digits shards"
    )


def test_a_long_group_is_cut_with_a_digest_that_keeps_it_unique():
    a = group_name([f"client.k{i}={i}" for i in range(40)], CHOICES)
    b = group_name([f"client.k{i}={i + (i == 39)}" for i in range(40)], CHOICES)
    assert len(a) == len(b) == MAX_GROUP and a != b


def _hydra_files(run_dir: Path, task: list[str], mode: str, **sweeper) -> None:
    (run_dir / ".hydra").mkdir(parents=True)
    hydra = {
        "mode": mode,
        "overrides": {"task": task},
        "runtime": {"choices": {**CHOICES, "experiment": "waffle_digits", "hydra/sweeper": "x"}},
        "sweeper": sweeper,
    }
    OmegaConf.save({"hydra": hydra}, run_dir / ".hydra" / "hydra.yaml")


def test_an_optuna_trial_is_named_by_its_searched_values_and_tagged_with_the_study(tmp_path):
    run_dir = tmp_path / "2025-01-02" / "10-11-12" / "3"
    task = ["hparams_search=fedprox_mu", "rounds=5", "algorithm.mu=0.0187381", "client.lr=0.05"]
    _hydra_files(
        run_dir,
        task,
        "MULTIRUN",
        study_name="fedprox_mu",
        params={"algorithm.mu": "interval(0.001, 1)", "client.lr": "interval(0.005, 0.5)"},
    )
    OmegaConf.save(
        {"hydra": {"overrides": {"task": ["rounds=5"]}}}, run_dir.parent / "multirun.yaml"
    )
    labels = labels_from_run_dir(run_dir, seed=0)
    assert labels.name == "fedprox mu=0.01874 lr=0.05 s0"
    assert labels.group == "fedprox rounds=5 mu=0.01874 lr=0.05 digits shards"
    assert labels.job_type == "fedprox"
    assert labels.tags == ("sweep:fedprox_mu", "experiment:waffle_digits", "dataset:digits")
    assert labels.config["choices"]["experiment"] == "waffle_digits"
    assert "hydra/sweeper" not in labels.config["choices"]
    assert labels.multirun


def test_a_plain_sweep_is_tagged_with_its_dated_dir(tmp_path):
    run_dir = tmp_path / "2025-01-02" / "10-11-12" / "0"
    _hydra_files(run_dir, ["dataset=digits", "seed=0"], "MULTIRUN")
    OmegaConf.save(
        {"hydra": {"overrides": {"task": ["dataset=digits,mnist"]}}},
        run_dir.parent / "multirun.yaml",
    )
    labels = labels_from_run_dir(run_dir, seed=0)
    assert labels.tags[0] == "sweep:2025-01-02/10-11-12"
    assert labels.name == "fedprox digits s0"  # a swept dataset is named


def test_no_hydra_files_no_labels(tmp_path):
    assert labels_from_run_dir(tmp_path, seed=0) is None


def test_a_dataset_target_of_ones_own_labels_the_run_by_its_name(tmp_path):
    run_dir = tmp_path / "run"
    _hydra_files(run_dir, ["dataset._target_=my_data.two_blobs"], "RUN")
    # the wiring labels the choices (`RunInfo.choices`) and the logger names the run by them
    choices = labelled_choices(CHOICES, "my_data.two_blobs")
    labels = labels_from_run_dir(run_dir, seed=0, choices=choices)
    assert "dataset:two_blobs" in labels.tags and labels.group.endswith(" two_blobs shards")
    assert labels.config["choices"]["dataset"] == "two_blobs"
