"""FRL's MNIST "LeNet" (the PyTorch MNIST example net): 3x3 conv 32, 3x3 conv 64 (padding 1),
2x2 max-pool, FC 128, FC classes. Not LeNet-5 (`models.cnn.lenet5`)."""

from __future__ import annotations

from torch import nn

from fedexp.models.cnn import _flat_size
from fedexp.models.conv8 import conv_stack
from fedexp.models.mlp import BodyHead


def lenet(
    input_shape: tuple[int, ...],
    num_classes: int,
    channels: tuple[int, int],
    hidden: int,
    bias: bool,
) -> BodyHead:
    """The dense model; FRL trains its supermask twin. `bias: false` matches FRL's code."""
    convs = nn.Sequential(*conv_stack(input_shape[0], tuple(channels), bias), nn.Flatten())
    width = _flat_size(convs, input_shape)
    body = nn.Sequential(*convs, nn.Linear(width, hidden, bias=bias), nn.ReLU())
    return BodyHead(body, nn.Linear(hidden, num_classes, bias=bias))
