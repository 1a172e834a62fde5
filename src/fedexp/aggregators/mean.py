"""Weighted mean: FedAvg's aggregate."""

from __future__ import annotations

import torch


def weighted_mean(
    updates: torch.Tensor, weights: torch.Tensor, num_malicious: int = 0
) -> torch.Tensor:
    """sum_k w_k u_k / sum_k w_k over the rows of `updates` (`num_malicious` is not used)."""
    w = weights.to(updates.dtype)
    return (w / w.sum()) @ updates
