"""Coordinate-wise median (Yin et al., 2018)."""

from __future__ import annotations

import torch


def median(updates: torch.Tensor, weights: torch.Tensor, num_malicious: int = 0) -> torch.Tensor:
    """Per coordinate, the middle value; for an even count the mean of the two middle values.

    Unweighted (a client cannot buy weight); `weights` and `num_malicious` are not used.
    """
    n = updates.shape[0]
    ordered = torch.sort(updates, dim=0).values
    if n % 2:
        return ordered[n // 2]
    return (ordered[n // 2 - 1] + ordered[n // 2]) / 2
