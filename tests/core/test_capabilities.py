"""What an algorithm can do is declared as attributes (`Algorithm.has_global_model`, ...), and
every declaration matches the hooks the algorithm implements; the wiring reads the attributes."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

import fedexp.algorithms
from fedexp.core.algorithm import Algorithm
from fedexp.core.client import ClientModule
from fedexp.run import resolve_objective


def algorithm_classes() -> list[type]:
    found = {}
    for info in pkgutil.iter_modules(fedexp.algorithms.__path__):
        module = importlib.import_module(f"fedexp.algorithms.{info.name}")
        for obj in vars(module).values():
            if inspect.isclass(obj) and issubclass(obj, Algorithm) and obj is not Algorithm:
                found[obj.__qualname__] = obj
    return [found[name] for name in sorted(found)]


CLASSES = algorithm_classes()


def overrides(cls: type, hook: str) -> bool:
    return getattr(cls, hook) is not getattr(Algorithm, hook)


def test_every_algorithm_of_the_package_is_checked():
    assert len(CLASSES) >= 18


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_declared_capabilities_match_the_hooks(cls):
    assert cls.has_personal_models == overrides(cls, "personal_model")
    assert cls.can_be_eavesdropped == overrides(cls, "eavesdropped_model")
    assert cls.batches_personal_models == overrides(cls, "personal_models")
    if cls.has_global_model:  # an algorithm may have the hook and no global model (FedRep)
        assert overrides(cls, "global_model")


def test_the_base_class_declares_nothing_but_vectorization():
    assert not (Algorithm.has_global_model or Algorithm.has_personal_models)
    assert not (Algorithm.batches_personal_models or Algorithm.can_be_eavesdropped)
    assert Algorithm.vectorizable


class _Declared:
    """A stand-in algorithm: only its declarations, no hooks."""

    def __init__(self, personal: bool, global_: bool):
        self.has_personal_models, self.has_global_model = personal, global_


@pytest.mark.parametrize(
    ("personal", "global_", "has_val", "expected"),
    [
        (True, True, True, "eval/val/personal/acc_mean"),
        (False, True, True, "eval/val/global/acc"),
        (True, False, False, "none"),
    ],
)
def test_the_objective_follows_the_declarations(personal, global_, has_val, expected):
    assert resolve_objective("auto", _Declared(personal, global_), has_val) == expected


def test_client_modules_declare_the_state_they_carry_per_client():
    # the vectorized executor stacks exactly these; the base module carries none
    assert ClientModule.per_client_state == ()
    declared = {
        c.__name__: c.per_client_state
        for cls in CLASSES
        for c in vars(importlib.import_module(cls.__module__)).values()
        if inspect.isclass(c) and issubclass(c, ClientModule) and c.per_client_state
    }
    assert declared["ProxModule"] == ("anchor",)
    assert declared["ScaffoldModule"] == ("correction",)
    assert set(declared) >= {"DittoModule", "ProtoModule", "WaffleModule", "AlignModule"}


def test_declared_state_that_begin_does_not_give_is_refused():
    import torch
    from torch import nn

    from fedexp.core.client_loop import load_start, module_rows
    from fedexp.core.cohort import CohortStart
    from fedexp.core.types import ConfigError
    from handworld import client_cfg

    class Anchored(ClientModule):
        per_client_state = ("anchor",)

    module = Anchored(nn.Linear(2, 2), client_cfg())
    with pytest.raises(ConfigError, match=r"declares per-client state \['anchor'\]"):
        load_start(module, CohortStart(module_rows(module)))
    start = CohortStart(module_rows(module), attrs={"anchor": torch.ones(1, 2)})
    load_start(module, start, row=0)
    assert torch.equal(module.anchor, torch.ones(2))  # the client's row


def test_an_algorithm_that_says_it_cannot_be_vectorized_trains_sequentially_under_auto():
    from components import with_yaml
    from fedexp.algorithms.fedavg import FedAvg
    from fedexp.core.types import ConfigError
    from fedexp.engine.executors.select import AutoExecutor
    from fedexp.engine.executors.sequential import SequentialExecutor
    from fedexp.engine.executors.vectorized import VectorizedExecutor
    from handworld import make_ctx, two_client_data

    class Unvectorizable(FedAvg):
        vectorizable = False

    Unvectorizable = with_yaml(Unvectorizable, "algorithm", "fedavg")
    data = two_client_data()
    with pytest.raises(ConfigError, match="Unvectorizable cannot be vectorized"):
        VectorizedExecutor(None, False, False, "cpu", "auto").check_algorithm(
            Unvectorizable(make_ctx(data)), 2
        )
    able = with_yaml(FedAvg, "algorithm", "fedavg")(make_ctx(data))  # the same, declared able
    VectorizedExecutor(None, False, False, "cpu", "auto").check_algorithm(able, 2)
    auto = AutoExecutor("cuda", None)  # would vectorize: training on CUDA
    assert isinstance(auto.inner, VectorizedExecutor)
    auto.check_algorithm(Unvectorizable(make_ctx(data)), 2)
    assert isinstance(auto.inner, SequentialExecutor)
