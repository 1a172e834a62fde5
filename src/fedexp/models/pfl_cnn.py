"""The CNN of pfl-research's CIFAR-10 cross-framework benchmark (Granqvist et al., 2024).

conv 3->32 3x3, ReLU, conv 32->64 3x3, ReLU, max-pool 2, FC 12544->128, ReLU, FC 128->10:
1,626,442 parameters on 3x32x32 inputs.
"""

from __future__ import annotations

from torch import nn

from fedexp.models.cnn import _flat_size
from fedexp.models.mlp import BodyHead


def pfl_cnn(input_shape: tuple[int, ...], num_classes: int, hidden: int) -> BodyHead:
    """pfl-research's `simple_cnn`; the body ends at the 128-wide representation."""
    convs = nn.Sequential(
        nn.Conv2d(input_shape[0], 32, 3),
        nn.ReLU(),
        nn.Conv2d(32, 64, 3),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
    )
    flat = _flat_size(convs, input_shape)
    body = nn.Sequential(*convs, nn.Linear(flat, hidden), nn.ReLU())
    return BodyHead(body, nn.Linear(hidden, num_classes))
