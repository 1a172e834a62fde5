"""The validation split, the objective a run returns, and classes no client holds."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir

from conftest import smoke_experiment
from fedexp.core.summary import Objective
from fedexp.core.types import ConfigError
from fedexp.data.partition import local_split

REPO = Path(__file__).resolve().parents[2]


experiment = smoke_experiment


def test_local_split_sizes_and_disjointness():
    parts = [np.arange(100), np.arange(100, 103), np.arange(103, 105), np.arange(105, 106)]
    train, val, test = local_split(parts, 0.2, np.random.default_rng(0), val_fraction=0.1)
    # 100 samples: 20 test, 10 validation, 70 train; 3: one each; 2: one test, one train
    assert [(len(a), len(b), len(c)) for a, b, c in zip(train, val, test)] == [
        (70, 10, 20),
        (1, 1, 1),
        (1, 0, 1),
        (1, 0, 0),
    ]
    for p, a, b, c in zip(parts, train, val, test):
        joined = np.concatenate([a, b, c])
        assert len(np.unique(joined)) == len(joined) == len(p)  # disjoint, nothing lost
        assert set(joined) == set(p)


def test_the_test_split_does_not_depend_on_the_validation_split():
    parts = [np.arange(i * 50, i * 50 + 50) for i in range(4)]
    _, _, test0 = local_split(parts, 0.2, np.random.default_rng(3), val_fraction=0.0)
    train1, val1, test1 = local_split(parts, 0.2, np.random.default_rng(3), val_fraction=0.1)
    for a, b in zip(test0, test1):
        np.testing.assert_array_equal(a, b)
    assert all(len(v) == 5 and len(t) == 35 for v, t in zip(val1, train1))


@pytest.mark.experiment
def test_validation_metrics_use_validation_data_only(tmp_path):
    exp = experiment(tmp_path, "algorithm=fedavg")
    data, part = exp.data, exp.data.partition
    assert data.has_val
    for c in range(data.num_clients):
        tr, va, te = set(part.train[c]), set(part.val[c]), set(part.test[c])
        assert va and not (va & tr) and not (va & te)
    orch = exp.orchestrator()
    orch.run()
    m = orch.last_eval
    model = exp.algorithm.global_model(orch.state)
    x, y = data.pooled_val()
    assert len(y) == sum(len(v) for v in part.val)
    with torch.no_grad():
        expected = float((model(x).argmax(1) == y).float().mean())
    assert m["eval/val/global/acc"] == pytest.approx(expected)
    assert {"eval/val/global/client_acc_mean", "eval/global/acc"} <= set(m)


@pytest.mark.experiment
def test_personal_validation_metrics_and_auto_objective(tmp_path):
    exp = experiment(tmp_path / "rep", "algorithm=fedrep")
    assert exp.objective == "eval/val/personal/acc_mean"
    summary = exp.run([])
    assert summary.objective == Objective(
        "eval/val/personal/acc_mean", summary.metrics["eval/val/personal/acc_mean"]
    )
    assert "eval/personal/acc_mean" in summary.metrics  # test metrics of the same round
    assert experiment(tmp_path / "avg", "algorithm=fedavg").objective == "eval/val/global/acc"
    # without a validation split `auto` is no objective, never the test metric
    exp = experiment(tmp_path / "noval", "partition.val_fraction=0")
    assert exp.objective == "none" and not exp.data.has_val
    summary = exp.run([])
    assert summary.objective == Objective("none", None) and "eval/global/acc" in summary.metrics
    assert summary.to_dict()["objective"] == {"name": "none", "value": None}


@pytest.mark.experiment
@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (("objective=eval/global/accuracy",), "objective: 'eval/global/accuracy' is not"),
        (("objective=acc",), "objective: 'acc' is not"),
        (("objective=eval/val/global/acc", "partition.val_fraction=0"), "needs a validation"),
        (("algorithm=fedrep", "objective=eval/val/global/acc"), "no global model"),
        (("algorithm=fedavg", "objective=eval/personal/acc_mean"), "no personal models"),
        (("partition.val_fraction=0.85",), "partition.val_fraction"),
        (("partition.val_fraction=-0.1",), "partition.val_fraction"),
    ],
)
def test_bad_objectives_and_fractions_are_refused(tmp_path, overrides, message):
    with pytest.raises(ConfigError, match=message):
        experiment(tmp_path, *overrides)


@pytest.mark.experiment
def test_classes_no_client_holds_are_refused_unless_allowed(tmp_path):
    # 2 clients x 2 classes: 4 of digits' 10 classes, so global accuracy cannot exceed ~0.4
    few = ("num_clients=2", "clients_per_round=2")
    with pytest.raises(ConfigError, match="partition: 6 classes of the pooled test set"):
        experiment(tmp_path / "a", *few, "partition.allow_missing_classes=false")
    exp = experiment(tmp_path / "b", *few, "partition.allow_missing_classes=true")
    summary = exp.run([])
    assert summary.metrics["data/classes_used"] == 4
    used = summary.metrics["data/train_fraction_used"]
    n = len(exp.data.dataset.train_y)
    assert used == pytest.approx(sum(len(t) for t in exp.data.partition.train) / n)
    assert used < 0.5
    assert summary.metrics["eval/global/acc"] <= 0.45


def test_hparams_search_presets_tune_on_validation_data():
    names = sorted(p.stem for p in (REPO / "conf" / "hparams_search").glob("*.yaml"))
    assert names
    for name in names:
        with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
            cfg = compose("config", overrides=[f"hparams_search={name}"])
        assert cfg.objective.startswith("eval/val/"), name
