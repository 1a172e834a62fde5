"""The communication ledger: exact bits of what crosses the client/server boundary.

Every `Message` says its own size (`num_bits`); the orchestrator sums the uploads and payloads of
each round into `comm/up_bits` and `comm/down_bits` and their cumulative `*_total`. The helpers
here are the wire formats those sizes assume:

- a float is `FLOAT_BITS` (32) bits;
- an index into `d` coordinates is `index_bits(d)` = ceil(log2 d) bits (0 for d = 1);
- a permutation of `n` items, sent as its indices, is `permutation_bits(n)` = n * ceil(log2 n);
- running statistics (BatchNorm's, the batch count too) are floats: `stats_bits(stats)`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

FLOAT_BITS = 32  # bits of one float on the wire

__all__ = ["FLOAT_BITS", "index_bits", "permutation_bits", "stats_bits"]


def index_bits(size: int) -> int:
    """Bits to name one of `size` positions: ceil(log2 size), exact in integer arithmetic."""
    if size < 1:
        raise ValueError(f"size must be >= 1, got {size}")
    return (size - 1).bit_length()


def permutation_bits(size: int) -> int:
    """Bits of a permutation of `size` items sent as `size` indices (FRL's rankings)."""
    return size * index_bits(size)


def stats_bits(stats: torch.Tensor | None) -> int:
    """Bits of running statistics on the wire, sent as one float vector (0 for None)."""
    return 0 if stats is None else stats.numel() * FLOAT_BITS
