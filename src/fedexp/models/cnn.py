"""Convolutional models. Input shape and class count come from the dataset config."""

from __future__ import annotations

import torch
from torch import nn

from fedexp.errors import ConfigError, with_checks
from fedexp.models.mlp import BodyHead


def needs_images(cfg, data) -> None:
    """Convolutional models take (channels, height, width) inputs."""
    if len(data.input_shape) != 3:
        raise ConfigError(
            f"model: {cfg.model._target_} needs image inputs (channels, height, width); "
            f"this dataset gives vectors of shape {tuple(data.input_shape)}; use model=mlp"
        )


def _flat_size(body: nn.Module, input_shape: tuple[int, ...]) -> int:
    with torch.no_grad():
        return body(torch.zeros(1, *input_shape)).shape[1]


@with_checks(data=needs_images)
def cnn(
    input_shape: tuple[int, ...],
    num_classes: int,
    channels: tuple[int, int] = (32, 64),
    hidden: tuple[int, int] = (512, 128),
    kernel_size: int = 5,
):
    """2 conv layers each followed by max-pooling, then 3 fully connected (FedHeNN's CIFAR CNN)."""
    c0 = input_shape[0]
    # inputs under 16 px (8x8 digits) are padded so both poolings keep a valid shape
    pad = kernel_size // 2 if min(input_shape[1:]) < 16 else 0
    convs = nn.Sequential(
        nn.Conv2d(c0, channels[0], kernel_size, padding=pad),
        nn.ReLU(),
        nn.MaxPool2d(2, ceil_mode=True),
        nn.Conv2d(channels[0], channels[1], kernel_size, padding=pad),
        nn.ReLU(),
        nn.MaxPool2d(2, ceil_mode=True),
        nn.Flatten(),
    )
    flat = _flat_size(convs, input_shape)
    body = nn.Sequential(
        *convs, nn.Linear(flat, hidden[0]), nn.ReLU(), nn.Linear(hidden[0], hidden[1]), nn.ReLU()
    )
    return BodyHead(body, nn.Linear(hidden[1], num_classes))


@with_checks(data=needs_images)
def lenet5(input_shape: tuple[int, ...], num_classes: int):
    """LeNet-5 (LeCun et al., 1998): conv 6@5x5, pool, conv 16@5x5, pool, FC 120, 84, classes.

    Small inputs (< 16 px) are padded so both poolings stay valid.
    """
    return cnn(input_shape, num_classes, channels=(6, 16), hidden=(120, 84), kernel_size=5)


def femnist_cnn(input_shape: tuple[int, ...], num_classes: int):
    """LEAF's FEMNIST CNN: conv 32@5x5 (same), pool 2, conv 64@5x5 (same), pool 2, FC 2048, FC.

    On 28x28 inputs: 7*7*64 = 3136 -> 2048 -> num_classes (6.6M parameters for 62 classes).
    """
    convs = nn.Sequential(
        nn.Conv2d(input_shape[0], 32, 5, padding=2),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 5, padding=2),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
    )
    flat = _flat_size(convs, input_shape)
    body = nn.Sequential(*convs, nn.Linear(flat, 2048), nn.ReLU())
    return BodyHead(body, nn.Linear(2048, num_classes))
