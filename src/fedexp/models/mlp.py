"""Fully connected models. Every model is `head(body(x))`: `body` gives the representation."""

from __future__ import annotations

import math

from torch import nn


class BodyHead(nn.Module):
    """A representation `body` followed by a linear task `head` (FedRep, FedHeNN split here)."""

    def __init__(self, body: nn.Module, head: nn.Module):
        super().__init__()
        self.body = body
        self.head = head

    def forward(self, x):
        return self.head(self.body(x))


def mlp(input_shape: tuple[int, ...], num_classes: int, hidden: tuple[int, ...]):
    """MLP with ReLU hidden layers (digits, synthetic)."""
    layers: list[nn.Module] = [nn.Flatten()]
    width = math.prod(input_shape)
    for h in hidden:
        layers += [nn.Linear(width, h), nn.ReLU()]
        width = h
    return BodyHead(nn.Sequential(*layers), nn.Linear(width, num_classes))
