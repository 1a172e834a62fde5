"""The spine's shortcuts give exactly what the slower code they replace gave."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fedexp.core.algorithm import Algorithm
from fedexp.core.client import ClientModule
from fedexp.core.flat import flat_delta, flat_params, load_flat, share_model_storage, share_storage
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


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))


def _per_tensor(params) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in params])


def test_shared_storage_keeps_values_and_makes_load_and_read_one_buffer():
    model = _net()
    params = list(model.parameters())
    before = [p.detach().clone() for p in params]
    share_storage(params)
    assert all(torch.equal(p, b) for p, b in zip(params, before))  # values unchanged
    assert list(model.parameters()) == params  # the same objects (optimizers hold them)
    base = params[0].data_ptr()
    offsets = [p.data_ptr() - base for p in params]
    assert offsets == [0, 48, 64, 96]  # 12, 4, 8 floats of 4 bytes, one after the other
    vector = torch.arange(26, dtype=torch.float32)
    load_flat(params, vector)
    assert torch.equal(params[0], vector[:12].view(4, 3))
    assert torch.equal(params[3], vector[24:])
    read = flat_params(params)
    assert torch.equal(read, vector) and read.data_ptr() != base  # a copy
    vector.add_(1.0)  # no aliasing: the parameters do not follow the loaded vector
    assert params[3].tolist() == [24.0, 25.0]


def test_shared_storage_trains_like_separate_tensors():
    x, y = torch.randn(8, 3), torch.randint(0, 2, (8,))
    results = []
    for shared in (False, True):
        model = _net()
        if shared:
            share_storage(list(model.parameters()))
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3)
        for _ in range(3):
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        results.append(flat_params(list(model.parameters())))
    assert torch.equal(results[0], results[1])


def test_a_replaced_storage_only_loses_the_shortcut():
    model = _net()
    params = list(model.parameters())
    share_storage(params)
    params[2].data = params[2].data.clone()  # what `module.to` or a reload does to one tensor
    vector = torch.arange(26, dtype=torch.float32)
    load_flat(params, vector)
    assert torch.equal(flat_params(params), vector)
    assert torch.equal(_per_tensor(params), vector)
    assert torch.equal(flat_params(params[1:]), vector[12:])  # another list: per tensor


def test_shared_storage_leaves_mixed_dtypes_alone():
    a = nn.Parameter(torch.ones(2))
    b = nn.Parameter(torch.ones(2, dtype=torch.float64))
    share_storage([a, b])
    assert a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr()
    load_flat([a, b], torch.tensor([1.0, 2.0, 3.0, 4.0]))
    assert b.tolist() == [3.0, 4.0] and b.dtype == torch.float64


def test_flat_delta_is_the_parameters_minus_the_reference_on_both_paths():
    reference = torch.linspace(-1.0, 1.0, 26)
    for shared in (True, False):
        params = list(_net().parameters())
        if shared:
            share_storage(params)
        delta = flat_delta(params, reference)
        assert torch.equal(delta, _per_tensor(params) - reference)
        delta.add_(1.0)  # a new tensor: the parameters do not move with it
        assert torch.equal(flat_delta(params, reference), _per_tensor(params) - reference)


def test_a_load_between_forward_and_backward_is_still_refused():
    # the parameters keep their own version counters: the fast load marks them written
    for shared in (False, True):
        model = _net()
        params = list(model.parameters())
        if shared:
            share_storage(params)
        loss = (model(torch.ones(1, 3)) ** 2).sum()
        load_flat(params, torch.zeros(26))
        with pytest.raises(RuntimeError, match="inplace"):
            loss.backward()


def test_shared_storage_leaves_strided_or_aliased_parameters_alone():
    conv = nn.Conv2d(3, 4, 3).to(memory_format=torch.channels_last)
    weight_strides = conv.weight.stride()
    share_storage(list(conv.parameters()))
    assert conv.weight.stride() == weight_strides  # channels-last kept
    a = nn.Parameter(torch.zeros(4))
    b = nn.Parameter(a.data[:2])  # b aliases a
    share_storage([a, b])
    a.data.add_(1.0)
    assert b.tolist() == [1.0, 1.0]  # still the same memory


def test_a_model_with_a_recurrent_layer_keeps_its_own_layout():
    model = nn.Sequential(nn.Embedding(5, 3), nn.LSTM(3, 4))
    params = list(model.parameters())
    share_model_storage(model, params)
    assert len({p.untyped_storage().data_ptr() for p in params}) == len(params)
    mlp = _net()
    share_model_storage(mlp, list(mlp.parameters()))
    assert len({p.untyped_storage().data_ptr() for p in mlp.parameters()}) == 1
