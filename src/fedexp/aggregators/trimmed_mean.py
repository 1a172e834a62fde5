"""Coordinate-wise trimmed mean (Yin et al., 2018): per coordinate, drop the `beta` largest and
the `beta` smallest values, average the rest."""

from __future__ import annotations

from typing import Any

import torch

from fedexp.aggregators import KNOWN, check_count, resolve_count


def trimmed_mean(
    updates: torch.Tensor,
    weights: torch.Tensor,
    num_malicious: int = 0,
    beta: Any = KNOWN,
) -> torch.Tensor:
    """Trimmed mean of the rows of `updates`; unweighted (a client cannot buy weight).

    Args:
        updates: [n, d] client updates.
        weights: [n] client weights (not used).
        num_malicious: the round's true number of malicious uploads.
        beta: values dropped per side per coordinate: `known` (= num_malicious, as the FRL paper
            grants its baselines), an int count, or a float fraction of n. Capped so that at least
            one value per coordinate remains.
    """
    n = updates.shape[0]
    trim = min(resolve_count(beta, num_malicious, n, "beta"), (n - 1) // 2)
    if trim == 0:
        return updates.mean(0)
    ordered = torch.sort(updates, dim=0).values
    return ordered[trim : n - trim].mean(0)


def _check(beta: Any = KNOWN) -> None:
    check_count(beta, "beta")


trimmed_mean.check = _check
