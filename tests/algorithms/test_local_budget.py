"""Every compared method trains `client.local_epochs` (E) a round by default; explicit epoch
options override it. Counted on one client with n = 5 samples and batch 2: ceil(5/2) = 3 steps
an epoch, so E = 3 is 9 steps (per model where a method trains two)."""

from __future__ import annotations

import pytest
import torch

from components import with_yaml
from fedexp.algorithms.ditto import Ditto
from fedexp.algorithms.fedavg import FedAvg
from fedexp.algorithms.fedper import FedPer
from fedexp.algorithms.fedproto import FedProto
from fedexp.algorithms.fedrep import FedRep
from fedexp.algorithms.local import Local
from fedexp.core.types import ConfigError
from handworld import make_ctx, one_client_data, one_round, small_mlp

OPTIONS = {
    "fedavg": FedAvg,
    "fedrep": FedRep,
    "fedper": FedPer,
    "ditto": Ditto,
    "fedproto": FedProto,
    "local": Local,
}
E, STEPS_PER_EPOCH = 3, 3  # n = 5, B = 2: batches of 2, 2, 1


def build(option: str, local_epochs: int = E, **options):
    cls = with_yaml(OPTIONS[option], "algorithm", option)
    ctx = make_ctx(one_client_data(n=5), factory=small_mlp, batch_size=2, local_epochs=local_epochs)
    return cls(ctx, **options)


def phases_of_one_round(algo) -> list[tuple[str, int, int]]:
    """(name, epochs, steps) of each phase the client trained in round 1."""
    seen = {}
    end = algo.end

    def record(module, payloads, params, training):
        for cid, phases in zip(training.client_ids, training.phases):
            seen[cid] = phases
        return end(module, payloads, params, training)

    algo.end = record
    one_round(algo, ids=(0,), aggregate=False)
    return [(p.name, p.epochs, p.steps) for p in seen[0]]


@pytest.mark.parametrize(
    ("option", "expected"),
    [
        ("fedavg", [("all", 3, 9)]),
        ("local", [("all", 3, 9)]),
        ("fedper", [("all", 3, 9)]),  # head and body jointly
        ("fedproto", [("all", 3, 9)]),
        # head: E - body_epochs = 3 - 1 = 2 epochs, then the body's 1: 6 + 3 = 9 steps
        ("fedrep", [("head", 2, 6), ("body", 1, 3)]),
        # the global copy E epochs, the personal model E epochs: 9 steps each
        ("ditto", [("global", 3, 9), ("personal", 3, 9)]),
    ],
)
def test_by_default_each_method_trains_E_epochs_a_round(option, expected):
    phases = phases_of_one_round(build(option))
    assert phases == expected
    per_model = {name: steps for name, _, steps in phases}
    if option == "fedrep":  # one model, trained in two phases
        assert sum(per_model.values()) == E * STEPS_PER_EPOCH
    else:
        assert set(per_model.values()) == {E * STEPS_PER_EPOCH}


@pytest.mark.parametrize(
    ("option", "options", "expected"),
    [
        ("fedrep", {"head_epochs": 4, "body_epochs": 2}, [("head", 4, 12), ("body", 2, 6)]),
        ("fedrep", {"body_epochs": 2}, [("head", 1, 3), ("body", 2, 6)]),  # head: 3 - 2
        ("fedrep", {"head_epochs": 0}, [("body", 1, 3)]),
        ("ditto", {"personal_epochs": 5}, [("global", 3, 9), ("personal", 5, 15)]),
    ],
)
def test_explicit_epoch_options_override_the_budget(option, options, expected):
    assert phases_of_one_round(build(option, **options)) == expected


def test_fedrep_at_E_equal_to_body_epochs_gives_the_head_one_epoch_and_says_so():
    # E - body_epochs = 0 would leave every client its initial head: the head gets one epoch
    algo = build("fedrep", local_epochs=1)
    assert phases_of_one_round(algo) == [("head", 1, 3), ("body", 1, 3)]
    assert not torch.equal(algo.store.get(0), algo._initial_head)  # the head trained
    (line,) = algo.run_warnings(rounds=5)
    assert "1 head + 1 body epochs a round, 2 in all against client.local_epochs=1" in line


def test_fedrep_warnings_name_a_part_that_never_trains():
    assert "heads never train" in build("fedrep", head_epochs=0).run_warnings(5)[0]
    assert "body never trains" in build("fedrep", head_epochs=2, body_epochs=0).run_warnings(5)[0]
    assert build("fedrep").run_warnings(5) == []  # auto at E = 3: 2 + 1 epochs
    assert (
        build("fedrep", head_epochs=4, body_epochs=2)
        .run_warnings(5)[0]
        .startswith("FedRep: 4 head + 2 body epochs a round, 6 in all")
    )


@pytest.mark.parametrize(
    ("local_epochs", "options", "message"),
    [
        (1, {"body_epochs": 2}, r"algorithm.body_epochs: must be <= client.local_epochs \(1\)"),
        (3, {"head_epochs": -1}, "algorithm.head_epochs: must be auto or an int >= 0, got -1"),
        (
            3,
            {"head_epochs": "all"},
            "algorithm.head_epochs: must be auto or an int >= 0, got 'all'",
        ),
        (3, {"body_epochs": "auto"}, "algorithm.body_epochs: must be an int >= 0"),
        (3, {"head_epochs": 0, "body_epochs": 0}, "algorithm.head_epochs/body_epochs: not both"),
        (3, {"body_epochs": True}, "algorithm.body_epochs: must be an int >= 0, got True"),
    ],
)
def test_bad_fedrep_epochs_are_config_errors(local_epochs, options, message):
    with pytest.raises(ConfigError, match=message):
        build("fedrep", local_epochs=local_epochs, **options)


def test_ditto_auto_personal_model_equals_an_explicit_E():
    auto, explicit = build("ditto"), build("ditto", personal_epochs=E)
    for algo in (auto, explicit):
        phases_of_one_round(algo)
    assert torch.equal(auto.store.get(0), explicit.store.get(0))  # the personal models


def test_fedrep_auto_head_epochs():
    from fedexp.algorithms.fedrep import phase_epochs

    assert phase_epochs("auto", 1, 1) == (1, 1)  # E = body_epochs: one epoch of the head's own
    assert phase_epochs("auto", 1, 10) == (9, 1)  # the authors' split of E = 10
    assert phase_epochs("auto", 2, 3) == (1, 2)
