"""Weighted mean: FedAvg's aggregate."""

from __future__ import annotations

import torch


def weighted_mean(updates: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """sum_k w_k u_k / sum_k w_k over the rows of `updates`."""
    w = weights.to(updates.dtype)
    return (w / w.sum()) @ updates
