"""Networks with BatchNorm (FedBN's models): the MLP and the CNN with a BatchNorm layer after
every hidden linear or convolutional layer, before its activation (the layout of FedBN's
reference code). The head stays a plain linear layer."""

from __future__ import annotations

from torch import nn

from fedexp.errors import with_checks
from fedexp.models.cnn import cnn, needs_images
from fedexp.models.mlp import BodyHead, mlp


def add_batch_norm(model: BodyHead) -> BodyHead:
    """`model` with BatchNorm after each Linear / Conv2d of its body (in place of the body)."""
    layers: list[nn.Module] = []
    for layer in model.body:
        layers.append(layer)
        if isinstance(layer, nn.Conv2d):
            layers.append(nn.BatchNorm2d(layer.out_channels))
        elif isinstance(layer, nn.Linear):
            layers.append(nn.BatchNorm1d(layer.out_features))
    model.body = nn.Sequential(*layers)
    return model


def mlp_bn(input_shape: tuple[int, ...], num_classes: int, hidden: tuple[int, ...]) -> BodyHead:
    """`fedexp.models.mlp.mlp` with BatchNorm1d after each hidden layer."""
    return add_batch_norm(mlp(input_shape, num_classes, hidden))


@with_checks(data=needs_images)
def cnn_bn(
    input_shape: tuple[int, ...],
    num_classes: int,
    channels: tuple[int, int],
    hidden: tuple[int, int],
    kernel_size: int,
) -> BodyHead:
    """`fedexp.models.cnn.cnn` with BatchNorm2d after each conv and BatchNorm1d after each
    hidden fully connected layer."""
    return add_batch_norm(cnn(input_shape, num_classes, channels, hidden, kernel_size))
