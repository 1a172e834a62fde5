"""Conv8 (Ramanujan et al., 2020; FRL's CIFAR-10 model) in its dense form.

3x3 convs (padding 1) 64, 64, pool, 128, 128, pool, 256, 256, pool, 512, 512, pool; FC 256, 256,
classes. FRL trains its supermask twin (`fedexp.models.supermask.to_supermask`); FedAvg and the
robust baselines train this dense one.
"""

from __future__ import annotations

from torch import nn

from fedexp.models.cnn import _flat_size
from fedexp.models.mlp import BodyHead


def conv_stack(in_channels: int, widths: tuple[int, ...], bias: bool) -> list[nn.Module]:
    """Pairs of 3x3 conv + ReLU, a 2x2 max-pool after each pair (ceil mode: the same shapes on
    even sizes such as 32x32, and still valid on small inputs such as 8x8 digits)."""
    layers: list[nn.Module] = []
    for i, width in enumerate(widths):
        layers += [nn.Conv2d(in_channels, width, 3, padding=1, bias=bias), nn.ReLU()]
        if i % 2 == 1:
            layers.append(nn.MaxPool2d(2, ceil_mode=True))
        in_channels = width
    return layers


def conv8(
    input_shape: tuple[int, ...],
    num_classes: int,
    channels: tuple[int, ...],
    hidden: tuple[int, ...],
    bias: bool,
) -> BodyHead:
    """Conv8; `bias: false` matches FRL's reference code (its builder has no biases)."""
    convs = nn.Sequential(*conv_stack(input_shape[0], tuple(channels), bias), nn.Flatten())
    width = _flat_size(convs, input_shape)
    fcs: list[nn.Module] = []
    for h in hidden:
        fcs += [nn.Linear(width, h, bias=bias), nn.ReLU()]
        width = h
    return BodyHead(nn.Sequential(*convs, *fcs), nn.Linear(width, num_classes, bias=bias))
