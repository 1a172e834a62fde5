"""Majority vote of signs (signSGD with majority vote, Bernstein et al., 2019)."""

from __future__ import annotations

import torch


def sign_vote(updates: torch.Tensor, weights: torch.Tensor, num_malicious: int = 0) -> torch.Tensor:
    """sign(sum_u sign(u)) per coordinate: +1, -1, or 0 on a tie. One client, one vote
    (`weights` and `num_malicious` are not used)."""
    return torch.sign(torch.sign(updates).sum(0))
