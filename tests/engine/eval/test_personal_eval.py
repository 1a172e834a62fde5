"""Batched personal evaluation equal to the per-client loop, a seeded sample of personal clients,
and pooled test and validation sets read in place."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import smoke_experiment
from fedexp.core.types import ConfigError
from fedexp.engine.eval.all_clients import evaluate, personal_sample
from fedexp.engine.eval.hits import accuracy
from fedexp.engine.eval.personal import personal_accuracies
from near_ties import assert_same_accuracies, near_ties


@pytest.mark.experiment
@pytest.mark.parametrize(
    "algorithm,executor,hook",
    [
        ("fedrep", "sequential", True),
        ("fedrep", "vectorized", True),
        ("fedrep", "sequential", False),  # the generic path: personal_model read and stacked
        ("waffle", "sequential", False),  # per-client factor masks as stacked attributes
    ],
)
def test_batched_personal_evaluation_equals_the_loop(tmp_path, algorithm, executor, hook):
    exp = smoke_experiment(
        tmp_path, f"algorithm={algorithm}", f"executor={executor}", "num_clients=12"
    )
    if not hook:
        exp.algorithm.personal_models = lambda state, ids: None
    orch = exp.orchestrator()
    orch.run()
    data = exp.data
    clients = np.arange(data.num_clients)
    batched = personal_accuracies(exp.algorithm, orch.state, data, clients, ("test", "val"))
    model = exp.algorithm.personal_model
    loop = {
        s: np.array([accuracy(model(orch.state, int(c)), *data.local(c, s)) for c in clients])
        for s in ("test", "val")
    }
    # exactly equal (the same hit counts, the same float32 division) but for samples whose
    # argmax the vmapped forward and the plain one may settle differently
    with torch.no_grad():
        ties = {
            s: [near_ties(model(orch.state, int(c)).eval()(data.local(c, s)[0])) for c in clients]
            for s in ("test", "val")
        }
    for s in ("test", "val"):
        assert_same_accuracies(batched[s], loop[s], data.split_sizes(s)[clients], ties[s])
    assert 0 < np.nanmean(batched["test"]) <= 1


@pytest.mark.experiment
def test_personal_clients_evaluates_the_same_seeded_sample(tmp_path):
    exp = smoke_experiment(tmp_path, "algorithm=fedrep", "num_clients=20")
    orch = exp.orchestrator()
    orch.run()
    full, every = evaluate(exp.algorithm, orch.state, exp.data)
    metrics, some = evaluate(exp.algorithm, orch.state, exp.data, personal_clients=5, seed=0)
    ids = some["personal_clients"]
    assert ids == sorted(ids) and len(set(ids)) == 5 and "personal_clients" not in every
    assert ids == personal_sample(20, 5, 0).tolist() != personal_sample(20, 5, 1).tolist()
    assert some["personal"] == [every["personal"][c] for c in ids]
    assert metrics["eval/personal/acc_mean"] == pytest.approx(np.mean(some["personal"]))
    assert personal_sample(20, None, 0).tolist() == list(range(20))


@pytest.mark.experiment
@pytest.mark.parametrize(
    "value,message",
    [("0", "eval.personal_clients: must be >= 1"), ("7", "exceeds num_clients=6"),
     ("half", "eval.personal_clients: must be an int or null")],
)  # fmt: skip
def test_personal_clients_bad_values_are_config_errors(tmp_path, value, message):
    with pytest.raises(ConfigError, match=message):
        smoke_experiment(tmp_path, "algorithm=fedrep", f"eval.personal_clients={value}")


@pytest.mark.experiment
def test_pooled_accuracies_read_in_place_equal_the_gathered_sets(tmp_path):
    """Without an official test split, evaluation reads the pooled test and validation sets in
    place (no copy of them); the values are those of the gathered sets, exactly."""
    exp = smoke_experiment(tmp_path, "dataset=synthetic", "num_clients=12")
    state = exp.algorithm.init_state()
    metrics, _ = evaluate(exp.algorithm, state, exp.data)
    model = exp.algorithm.global_model(state)
    assert exp.data.test_is_pooled and exp.data._test_xy is None  # never gathered
    assert metrics["eval/global/acc"] == accuracy(model, exp.data.test_x, exp.data.test_y)
    assert metrics["eval/val/global/acc"] == accuracy(model, *exp.data.pooled_val())
    assert len(exp.data.test_y) == exp.data.split_sizes("test").sum()
