"""The spine's shortcuts give exactly what the slower code they replace gave."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fedexp.core.algorithm import Algorithm
from fedexp.core.client import ClientModule
from fedexp.core.local import ClientConfig
from fedexp.core.seeding import seed_global_rng
from fedexp.core.types import ServerState

INF, NAN = float("inf"), float("nan")


@pytest.mark.parametrize(
    "values",
    [[1.0, -2.0], [1.0, NAN], [INF, 1.0], [INF, -INF], [-INF], [3.4e38] * 1000, [-3.4e38] * 7],
)
def test_state_is_finite_equals_elementwise_isfinite(values):
    params = torch.tensor(values, dtype=torch.float32)
    expected = bool(torch.isfinite(params).all())
    assert Algorithm.state_is_finite(None, ServerState(params)) is expected


def test_seed_global_rng_is_manual_seed_on_the_cpu():
    torch.manual_seed(123)
    expected = torch.rand(5)
    seed_global_rng(123, torch.device("cpu"))
    assert torch.equal(torch.rand(5), expected)


def test_model_params_follow_a_replaced_model():
    cfg = {"lr": 0.1, "weight_decay": 0.0, "optimizer": "sgd", "momentum": 0.0}
    cfg = ClientConfig(**cfg, local_epochs=1, batch_size=1)
    module = ClientModule(nn.Linear(2, 2), cfg)
    assert module.model_params() == tuple(module.model.parameters())
    assert len(list(module.parameters())) == 2  # the cache is not registered as a submodule
    module.model = nn.Sequential(nn.Linear(2, 3), nn.Linear(3, 1))
    assert module.model_params() == tuple(module.model.parameters())
    assert [p.shape for p in module.phases()[0].params] == [(3, 2), (3,), (1, 3), (1,)]
    assert cfg.optimizer_spec == ("sgd", {"lr": 0.1, "weight_decay": 0.0, "momentum": 0.0})
