"""cnn_family: five CNNs from 1 conv + 1 FC to 3 conv + 3 FC behind one factory."""

from __future__ import annotations

from functools import partial

import pytest
import torch
from torch import nn

from components import with_yaml
from fedexp.core.types import ConfigError
from fedexp.models.family import cnn_family, family_layouts, family_size

cnn_family = with_yaml(cnn_family, "model", "cnn_family")


def layer_counts(model: nn.Module) -> tuple[int, int]:
    convs = sum(isinstance(m, nn.Conv2d) for m in model.modules())
    linears = sum(isinstance(m, nn.Linear) for m in model.modules())
    return convs, linears


@pytest.mark.parametrize("shape", [(1, 8, 8), (3, 32, 32)])
def test_five_architectures_smallest_to_largest(shape):
    expected = [(1, 1), (1, 2), (2, 2), (2, 3), (3, 3)]
    widths = []
    for arch, layout in enumerate(expected):
        model = cnn_family(shape, 7, arch=arch)
        assert layer_counts(model) == layout
        x = torch.zeros(2, *shape)
        assert model(x).shape == (2, 7)
        assert isinstance(model.head, nn.Linear)  # the head is the last FC layer
        widths.append(model.body(x).shape[1])
    # arch 0 represents with its flattened conv features (16 channels, one 2x2 pooling)
    assert widths == [16 * (shape[1] // 2) ** 2, 128, 128, 128, 128]


def test_num_archs_spreads_over_the_family_and_is_found_on_the_partial():
    assert family_layouts(2) == [(1, 1), (3, 3)]
    assert family_layouts(3) == [(1, 1), (2, 2), (3, 3)]
    factory = partial(partial(cnn_family, num_archs=3), input_shape=(1, 8, 8), num_classes=10)
    assert family_size(factory) == 3
    assert family_size(partial(nn.Linear, 3)) is None
    assert layer_counts(factory(arch=2)) == (3, 3)


def test_family_misuse_is_a_config_error():
    with pytest.raises(ConfigError, match="model: cnn_family is a family"):
        cnn_family((1, 8, 8), 10)
    with pytest.raises(ConfigError, match="model.num_archs"):
        cnn_family((1, 8, 8), 10, arch=0, num_archs=6)
    with pytest.raises(ConfigError, match="image inputs"):
        cnn_family((60,), 10, arch=0)


def test_mlp_family_spreads_depth_and_width_from_the_smallest_to_the_largest():
    from fedexp.models.family import mlp_family

    def widths(arch, num_archs=5):
        model = mlp_family((40,), 10, num_archs=num_archs, hidden=(200, 200, 200), arch=arch)
        return [m.out_features for m in model.body if isinstance(m, torch.nn.Linear)]

    # six layouts (depth 1..3, narrow then wide); five of them spread evenly: 0, 1, 2, 4, 5
    assert [widths(a) for a in range(5)] == [
        [100], [200], [100, 200], [100, 100, 200], [200, 200, 200],
    ]  # fmt: skip
    assert [widths(a, 2) for a in range(2)] == [[100], [200, 200, 200]]
    model = mlp_family((40,), 10, num_archs=5, hidden=(200, 200, 200), arch=4)
    assert model(torch.zeros(3, 40)).shape == (3, 10)
    with pytest.raises(ConfigError, match="model.num_archs"):
        mlp_family((40,), 10, num_archs=7, hidden=(200, 200, 200), arch=0)
    with pytest.raises(ConfigError, match="mlp_family is a family"):
        mlp_family((40,), 10, num_archs=5, hidden=(200,))


def test_auto_family_is_the_mlp_family_for_flat_inputs_and_the_cnn_family_for_images():
    from fedexp.config.build import default_family

    flat = default_family("auto", {"input_shape": (40,), "num_classes": 10})
    images = default_family("auto", {"input_shape": (1, 8, 8), "num_classes": 10})
    assert flat.func.__name__ == "mlp_family" and images.func.__name__ == "cnn_family"
    assert flat(arch=0)(torch.zeros(2, 40)).shape == (2, 10)
