"""Supermask layers: the mask, the straight-through gradient, k = 1, rankings, conversion."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from components import with_yaml
from fedexp.core.types import ConfigError
from fedexp.models.conv8 import conv8
from fedexp.models.lenet import lenet
from fedexp.models.mlp import mlp
from fedexp.models.supermask import (
    SupermaskConv2d,
    SupermaskLinear,
    edge_mask,
    num_kept,
    ranking,
    sorted_scores,
    supermask_layers,
    to_supermask,
    write_ranking,
)

mlp = with_yaml(mlp, "model", "mlp")
lenet = with_yaml(lenet, "model", "lenet")
conv8 = with_yaml(conv8, "model", "conv8")


def linear_layer(k: float, seed: int = 0) -> SupermaskLinear:
    torch.manual_seed(seed)
    layer = SupermaskLinear(4, 3, k)
    nn.init.normal_(layer.weight)
    nn.init.normal_(layer.scores)
    return layer


def test_mask_keeps_the_top_k_abs_scores():
    scores = torch.tensor([[0.1, -0.9, 0.3], [-0.2, 0.5, 0.05]])
    mask = edge_mask(scores, 0.5)
    assert torch.equal(mask, torch.tensor([[0.0, 1.0, 1.0], [0.0, 1.0, 0.0]]))
    assert num_kept(6, 0.5) == 3 and num_kept(10, 0.25) == 3 and num_kept(10, 1.0) == 10


def test_k_one_equals_the_dense_layer():
    layer = linear_layer(1.0)
    x = torch.randn(5, 4)
    assert torch.equal(layer(x), F.linear(x, layer.weight))
    conv = nn.Conv2d(2, 3, 3, padding=1, bias=False)
    masked = SupermaskConv2d(conv, k=1.0)
    masked.weight.copy_(conv.weight.detach())
    nn.init.normal_(masked.scores)
    image = torch.randn(2, 2, 5, 5)
    assert torch.equal(masked(image), conv(image))


def test_straight_through_gradient():
    layer = linear_layer(0.5)
    x, c = torch.randn(5, 4), torch.randn(5, 3)
    (layer(x) * c).sum().backward()
    # dL/dW_eff = c^T x for L = sum(c * (x W_eff^T)); then times θ^w, then through |s|
    expected = (c.T @ x) * layer.weight * torch.sign(layer.scores.detach())
    assert torch.allclose(layer.scores.grad, expected, atol=1e-6)
    assert layer.weight.grad is None  # frozen: a buffer, not a parameter


def test_write_then_rank_returns_the_ranking():
    scores = torch.randn(3, 4)
    for key in ("abs", "signed"):
        s0 = sorted_scores(scores, key)
        target = torch.randperm(12)
        fresh = torch.zeros(3, 4)
        write_ranking(fresh, target, s0)
        assert torch.equal(ranking(fresh, key), target)
    # abs key: the top k of the ranking is exactly the kept subnetwork
    fresh = torch.zeros(3, 4)
    write_ranking(fresh, target, sorted_scores(scores, "abs"))
    kept = edge_mask(fresh, 0.5).reshape(-1).nonzero().flatten()
    assert set(kept.tolist()) == set(target[-6:].tolist())


def test_to_supermask_drops_biases_and_freezes_weights():
    torch.manual_seed(0)
    model = to_supermask(mlp((4,), 3, hidden=(5,)), k=0.5, weight_init="signed_constant")
    layers = supermask_layers(model)
    assert [tuple(m.weight.shape) for m in layers] == [(5, 4), (3, 5)]
    assert [n for n, _ in model.named_parameters()] == ["body.1.scores", "head.scores"]
    # signed constant: ±sqrt(2 / fan_in)
    assert torch.equal(layers[0].weight.abs(), torch.full((5, 4), (2 / 4) ** 0.5))
    assert model(torch.randn(2, 4)).shape == (2, 3)


@pytest.mark.parametrize("weight_init", ["kaiming_normal", "kaiming_uniform"])
def test_other_weight_inits(weight_init):
    torch.manual_seed(0)
    model = to_supermask(lenet((1, 8, 8), 10), weight_init=weight_init)
    assert len(supermask_layers(model)) == 4
    assert model(torch.randn(2, 1, 8, 8)).shape == (2, 10)


def test_conv8_has_eight_masked_layers_and_the_paper_shape():
    model = to_supermask(conv8((3, 32, 32), 10))
    assert len(supermask_layers(model)) == 11  # 8 convs + 3 fully connected
    assert supermask_layers(model)[8].weight.shape == (256, 2048)  # 512 x 2 x 2 after 4 pools


def test_models_that_cannot_be_masked_are_a_config_error():
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))
    with pytest.raises(ConfigError, match="cannot be masked"):
        to_supermask(model)
    with pytest.raises(ConfigError, match="weight_init"):
        to_supermask(mlp((4,), 3), weight_init="xavier")
