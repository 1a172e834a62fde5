"""`dataset=hf` on plain data files written here (CSV, JSON lines): a file is the training
split, a directory's files are split by name; numeric columns become a vector input. A natural
split with fewer owners than `num_clients` runs with the owners there are."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import yaml
from tests.conftest import REPO, smoke_experiment

from fedexp.data import hub
from fedexp.errors import ConfigError

DEFAULTS = yaml.safe_load((REPO / "conf" / "dataset" / "hf.yaml").read_text())["dataset"]


def load_hf(path, data_dir, **options):
    """`hub.load_hf` with conf/dataset/hf.yaml's defaults for the options not given."""
    kept = {k: v for k, v in DEFAULTS.items() if k not in ("_target_", "path", "data_dir")}
    return hub.load_hf(str(path), str(data_dir), **{**kept, **options})


def write_csv(path, rows: int, users: int = 4):
    """Row i: a = i, b = 2 (constant), y = i % 3, user u<i % users>."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = ["a,b,y,user"] + [f"{i},2,{i % 3},u{i % users}" for i in range(rows)]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_csv_file_is_the_train_split_and_features_are_standardised(tmp_path):
    path = write_csv(tmp_path / "train.csv", 5)
    data = load_hf(path, tmp_path, feature_keys="*", label_key="y", client_key="user")
    assert data.name == "train.csv" and data.input_shape == (2,) and data.num_classes == 3
    assert data.test_x is None  # one file: no test split (test_fraction 0)
    assert data.train_y.tolist() == [0, 1, 2, 0, 1]
    assert data.train_client_ids.tolist() == [0, 1, 2, 3, 0]
    # a: 0..4, mean 2, population std sqrt(2); b constant: (2 - 2) / 1e-6 = 0
    expected = [(i - 2) / np.sqrt(2) for i in range(5)]
    assert data.train_x[:, 0].tolist() == pytest.approx(expected, rel=1e-6)
    assert data.train_x[:, 1].tolist() == [0.0] * 5


def test_a_directory_of_csv_and_json_lines_splits_by_file_name(tmp_path):
    root = tmp_path / "tab"
    write_csv(root / "train.csv", 6)
    (root / "test.jsonl").write_text('{"a": 6, "b": 2, "y": 1}\n{"a": 3, "b": 2, "y": 0}\n')
    # the test split has no `user` column: only the training split needs the owner
    data = load_hf(root, tmp_path, feature_keys=["a"], label_key="y", client_key="user")
    assert data.input_shape == (1,) and data.test_y.tolist() == [1, 0]
    # scaled by the training rows' statistics: a = 0..5, mean 2.5, std sqrt(35/12)
    std = np.sqrt(35 / 12)
    assert data.test_x[:, 0].tolist() == pytest.approx([3.5 / std, 0.5 / std], rel=1e-6)


def test_bad_feature_columns_and_missing_paths_are_one_line(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("a,y\n1,0\nx,1\n")
    with pytest.raises(ConfigError, match=r"t.csv: split train, column a: row 1: 'x' is not a"):
        load_hf(path, tmp_path, feature_keys=["a"], label_key="y")
    with pytest.raises(ConfigError, match=r"dataset.feature_keys: no column 'c' in split"):
        load_hf(path, tmp_path, feature_keys=["c"], label_key="y")
    with pytest.raises(ConfigError, match=r"^dataset.path: no file or directory .*nope.csv$"):
        load_hf(tmp_path / "nope.csv", tmp_path, feature_keys="*", label_key="y")


@pytest.mark.experiment
def test_natural_split_with_fewer_owners_runs_with_them_and_says_so(tmp_path, caplog):
    path = write_csv(tmp_path / "train.csv", 60, users=4)
    overrides = [
        "dataset=hf",
        f"dataset.path={path}",
        "dataset.feature_keys=[a,b]",
        "dataset.label_key=y",
        "dataset.client_key=user",
        "partition=natural",
        "partition.server_pool=0",
    ]
    with caplog.at_level(logging.INFO, logger="fedexp.data.schemes"):
        exp = smoke_experiment(tmp_path, *overrides)  # debug=smoke: 6 clients, 3 a round
    assert exp.data.num_clients == 4  # the 4 users
    held = sum(exp.data.split_sizes(s) for s in ("train", "val", "test"))
    assert held.tolist() == [15, 15, 15, 15]  # each client: every row of one user
    said = [r.getMessage() for r in caplog.records if "eligible owners" in r.getMessage()]
    assert said == [
        "partition: the data have 4 eligible owners, fewer than num_clients=6: running with "
        "4 clients, 3 a round"
    ]
    # clients_per_round above the owners, as num_clients: every client each round, said once
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="fedexp.data.schemes"):
        exp = smoke_experiment(tmp_path / "b", *overrides, "clients_per_round=5")
    said = [r.getMessage() for r in caplog.records if "eligible owners" in r.getMessage()]
    assert said == [
        "partition: the data have 4 eligible owners, fewer than num_clients=6: running with "
        "4 clients, 4 a round (clients_per_round=5 asked)"
    ]
    assert exp.data.num_clients == 4
    orchestrator = exp.orchestrator()
    assert orchestrator.clients_per_round == 4
    _, metrics = orchestrator.run_round(exp.algorithm.init_state(), 1)  # draws 4 of 4 clients
    assert metrics["train/loss"] > 0
