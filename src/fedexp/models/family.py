"""Model families: several architectures behind one factory, chosen per client by `arch`.

A family factory takes `(input_shape, num_classes, arch=i, num_archs=N, ...)`; its YAML carries
`num_archs`, which is how an algorithm recognises a family (see `family_size`). Which client gets
which architecture is drawn by `fedexp.core.seeding.client_arch`; a family named by its config
(`algorithm.default_family`) is built by `fedexp.config.build.default_family`.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from torch import nn

from fedexp.errors import ConfigError
from fedexp.models.mlp import BodyHead

# (conv layers, fully connected layers including the head), smallest to largest (FedHeNN, Sec. 5)
CNN_FAMILY_LAYOUTS = ((1, 1), (1, 2), (2, 2), (2, 3), (3, 3))


def family_size(factory: Callable) -> int | None:
    """`num_archs` of a (partially applied) family factory, or None for a single architecture."""
    keywords = getattr(factory, "keywords", None) or {}
    size = keywords.get("num_archs")
    return None if size is None else int(size)


def family_layouts(num_archs: int, layouts: tuple = CNN_FAMILY_LAYOUTS) -> list:
    """`num_archs` layouts spread evenly from the smallest to the largest."""
    if not 1 <= num_archs <= len(layouts):
        raise ConfigError(f"model.num_archs: must be in [1, {len(layouts)}], got {num_archs}")
    picks = np.linspace(0, len(layouts) - 1, num_archs).round().astype(int)
    return [layouts[i] for i in picks]


def cnn_family(
    input_shape: tuple[int, ...],
    num_classes: int,
    *,
    num_archs: int,
    channels: tuple[int, ...],
    hidden: tuple[int, ...],
    kernel_size: int,
    min_fc_layers: int,
    arch: int | None = None,
) -> BodyHead:
    """Architecture `arch` of FedHeNN's heterogeneous CNNs: 1 conv + 1 FC up to 3 conv + 3 FC.

    Each conv layer (channels[i], same padding) is followed by ReLU and 2x2 max-pooling. The
    fully connected layers before the head take the last entries of `hidden`, so archs with 2 or
    3 FC layers share the representation width hidden[-1]; arch 0 represents with its flattened
    conv features. The head is the last FC layer; the representation is everything before it.
    `min_fc_layers=2` gives every arch at least one FC layer before the head, so all archs
    represent with width hidden[-1] (algorithms that compare representations, e.g. FedProto).
    """
    if arch is None:
        raise ConfigError(
            "model: cnn_family is a family of architectures; use it with an algorithm that gives "
            "each client its own (algorithm=fedhenn algorithm.variant=heterogeneous)"
        )
    if len(input_shape) != 3:
        raise ConfigError(f"model: cnn_family needs image inputs (C, H, W), got {input_shape}")
    layouts = family_layouts(num_archs)
    if not 0 <= arch < num_archs:
        raise ValueError(f"arch must be in [0, {num_archs}), got {arch}")
    if min_fc_layers not in (1, 2):
        raise ConfigError(f"model.min_fc_layers: must be 1 or 2, got {min_fc_layers}")
    num_conv, num_fc = layouts[arch]
    num_fc = max(num_fc, min_fc_layers)
    if num_conv > len(channels) or num_fc - 1 > len(hidden):
        raise ConfigError("model.channels/hidden: too few entries for the largest architecture")
    layers: list[nn.Module] = []
    in_ch, (height, width) = input_shape[0], input_shape[1:]
    for out_ch in channels[:num_conv]:
        layers += [
            nn.Conv2d(in_ch, out_ch, kernel_size, padding=kernel_size // 2),
            nn.ReLU(),
            nn.MaxPool2d(2, ceil_mode=True),
        ]
        in_ch, height, width = out_ch, -(-height // 2), -(-width // 2)
    layers.append(nn.Flatten())
    features = in_ch * height * width
    for out in hidden[len(hidden) - (num_fc - 1) :]:
        layers += [nn.Linear(features, out), nn.ReLU()]
        features = out
    return BodyHead(nn.Sequential(*layers), nn.Linear(features, num_classes))


def mlp_family(
    input_shape: tuple[int, ...],
    num_classes: int,
    *,
    num_archs: int,
    hidden: tuple[int, ...],
    arch: int | None = None,
) -> BodyHead:
    """Architecture `arch` of an MLP family: 1 up to len(hidden) hidden layers (FedHeNN's
    heterogeneous clients for flat inputs, e.g. MNIST-1D).

    The layouts, smallest to largest, are each depth d = 1..len(hidden) first narrow, then wide;
    `num_archs` of them are spread evenly (`family_layouts`). An arch of depth d takes the last d
    entries of `hidden`; the narrow one halves every layer but the last (a depth-1 arch: that
    layer), so archs of depth ≥ 2 represent with width hidden[-1].
    """
    if arch is None:
        raise ConfigError(
            "model: mlp_family is a family of architectures; use it with an algorithm that gives "
            "each client its own (algorithm=fedhenn algorithm.variant=heterogeneous)"
        )
    if not hidden:
        raise ConfigError("model.hidden: an mlp_family needs at least one hidden layer")
    layouts = tuple((d, narrow) for d in range(1, len(hidden) + 1) for narrow in (True, False))
    chosen = family_layouts(num_archs, layouts)
    if not 0 <= arch < num_archs:
        raise ValueError(f"arch must be in [0, {num_archs}), got {arch}")
    depth, narrow = chosen[arch]
    widths = list(hidden[len(hidden) - depth :])
    if narrow:
        keep = 0 if depth == 1 else 1
        widths = [max(1, w // 2) for w in widths[: len(widths) - keep]] + widths[
            len(widths) - keep :
        ]
    layers: list[nn.Module] = [nn.Flatten()]
    features = int(np.prod(input_shape))
    for out in widths:
        layers += [nn.Linear(features, out), nn.ReLU()]
        features = out
    return BodyHead(nn.Sequential(*layers), nn.Linear(features, num_classes))
