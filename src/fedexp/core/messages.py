"""Messages of the compressed and robust algorithms (dense `Weights` live in `core.types`).

Each says its exact size on the wire (see `fedexp.metrics.comm` for the formats).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fedexp.core.types import Message
from fedexp.metrics.comm import FLOAT_BITS, index_bits, permutation_bits


@dataclass(frozen=True)
class Signs(Message):
    """One sign per coordinate (+1 / -1 as int8), packed on the wire as 1 bit each (SignSGD)."""

    values: torch.Tensor

    def num_bits(self) -> int:
        return self.values.numel()


@dataclass(frozen=True)
class SparseDelta(Message):
    """The kept coordinates of a `dim`-long vector: float values and their indices (TopK)."""

    values: torch.Tensor
    indices: torch.Tensor
    dim: int

    def num_bits(self) -> int:
        return self.values.numel() * (FLOAT_BITS + index_bits(self.dim))

    def dense(self) -> torch.Tensor:
        out = torch.zeros(self.dim, dtype=self.values.dtype, device=self.values.device)
        return out.index_put((self.indices,), self.values)


@dataclass(frozen=True)
class Ranking(Message):
    """One permutation per supermask layer: edge ids from the lowest to the highest rank (FRL)."""

    layers: tuple[torch.Tensor, ...]

    def num_bits(self) -> int:
        return sum(permutation_bits(layer.numel()) for layer in self.layers)
