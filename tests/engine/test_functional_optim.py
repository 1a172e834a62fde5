"""The functional SGD/Adam of the vectorised executor against torch.optim, client by client."""

from __future__ import annotations

import pytest
import torch

from fedexp.core.types import ConfigError
from fedexp.engine.functional_optim import FunctionalOptimizer, GroupSpec, spec_from_optimizer

CASES = [
    dict(kind="sgd", lr=0.1),
    dict(kind="sgd", lr=0.1, momentum=0.9, weight_decay=0.01),
    dict(kind="sgd", lr=0.05, momentum=0.9, dampening=0.1),
    dict(kind="sgd", lr=0.05, momentum=0.5, nesterov=True),
    dict(kind="adam", lr=0.01),
    dict(kind="adam", lr=0.01, weight_decay=0.1, betas=(0.8, 0.99), eps=1e-6),
]


def torch_optimizer(params, spec: GroupSpec) -> torch.optim.Optimizer:
    if spec.kind == "sgd":
        return torch.optim.SGD(
            params,
            lr=spec.lr,
            momentum=spec.momentum,
            dampening=spec.dampening,
            nesterov=spec.nesterov,
            weight_decay=spec.weight_decay,
        )
    return torch.optim.Adam(
        params, lr=spec.lr, betas=spec.betas, eps=spec.eps, weight_decay=spec.weight_decay
    )


@pytest.mark.parametrize("case", CASES)
def test_stacked_steps_match_one_torch_optimizer_per_client(case):
    # Prepare: 3 clients, one 2x3 parameter each, 4 steps of fixed gradients
    spec = GroupSpec(**case)
    gen = torch.Generator().manual_seed(0)
    start = torch.randn(3, 2, 3, generator=gen)
    grads = torch.randn(4, 3, 2, 3, generator=gen)
    # Execute
    params = {"w": start.clone()}
    optim = FunctionalOptimizer({"w": spec})
    for g in grads:
        optim.step(params, {"w": g}, None)
    # Assert: each client equals its own torch optimizer
    for c in range(3):
        w = torch.nn.Parameter(start[c].clone())
        opt = torch_optimizer([w], spec)
        for g in grads:
            w.grad = g[c].clone()
            opt.step()
        torch.testing.assert_close(params["w"][c], w.detach(), rtol=1e-6, atol=1e-7)
        if spec.kind == "sgd":  # torch.optim.SGD's operations, one for one
            assert torch.equal(params["w"][c], w.detach())


def test_later_steps_update_the_optimizers_own_tensors_in_place():
    spec = GroupSpec("sgd", lr=0.5, momentum=0.9)
    start = torch.ones(2, 3)
    params = {"w": start}
    optim = FunctionalOptimizer({"w": spec})
    optim.step(params, {"w": torch.ones(2, 3)}, None)  # w = 1 - 0.5, buf = 1
    first, buf = params["w"], optim.state["w"]["momentum"]
    assert first is not start and torch.equal(start, torch.ones(2, 3))  # the input untouched
    optim.step(params, {"w": torch.ones(2, 3)}, None)  # buf = 0.9 + 1, w = 0.5 - 0.95
    assert params["w"] is first and optim.state["w"]["momentum"] is buf
    assert torch.allclose(first, torch.full((2, 3), 0.5 - 0.95))
    # the caller's own parameters (the loop form): updated in place from the first step
    own = torch.zeros(2, 3)
    optim = FunctionalOptimizer({"w": GroupSpec("adam", lr=0.1)})
    optim.step({"w": own}, {"w": torch.ones(2, 3)}, None, in_place=True)
    assert torch.allclose(own, torch.full((2, 3), -0.1))


def test_inactive_client_keeps_params_and_momentum():
    spec = GroupSpec("sgd", lr=1.0, momentum=0.5)
    params = {"w": torch.zeros(2, 1)}
    optim = FunctionalOptimizer({"w": spec})
    optim.step(params, {"w": torch.ones(2, 1)}, None)  # both: w = -1, buf = 1
    optim.step(params, {"w": torch.ones(2, 1)}, torch.tensor([True, False]))
    # client 0: buf = 0.5 * 1 + 1 = 1.5, w = -1 - 1.5; client 1 untouched
    assert torch.equal(params["w"], torch.tensor([[-2.5], [-1.0]]))
    assert torch.equal(optim.state["w"]["momentum"], torch.tensor([[1.5], [1.0]]))


def test_spec_reads_param_groups_and_rejects_other_optimizers():
    a, b = torch.nn.Parameter(torch.zeros(1)), torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([{"params": [a]}, {"params": [b], "lr": 0.5}], lr=0.1, momentum=0.9)
    specs = spec_from_optimizer(opt, {id(a): "a", id(b): "b"})
    assert (specs["a"].lr, specs["b"].lr, specs["b"].momentum) == (0.1, 0.5, 0.9)
    with pytest.raises(ConfigError, match="executor"):
        spec_from_optimizer(torch.optim.RMSprop([a]), {id(a): "a"})


def test_a_parameter_without_gradient_takes_no_step_as_in_torch():
    # weight decay and momentum would move it if a zero gradient were stepped
    spec = GroupSpec("sgd", lr=0.5, momentum=0.9, weight_decay=0.1)
    params = {"a": torch.ones(2, 1), "b": torch.ones(2, 1)}
    optim = FunctionalOptimizer({"a": spec, "b": spec})
    optim.step(params, {"a": torch.ones(2, 1)}, None)
    assert torch.equal(params["b"], torch.ones(2, 1)) and optim.state["b"] == {}
    w = torch.nn.Parameter(torch.ones(1))
    opt = torch.optim.SGD([w], lr=0.5, momentum=0.9, weight_decay=0.1)
    opt.step()  # w.grad is None
    assert torch.equal(w.detach(), torch.ones(1)) and not opt.state[w]
