"""Coordinate-wise trimmed mean (Yin et al., 2018): per coordinate, drop the `beta` largest and
the `beta` smallest values, average the rest."""

from __future__ import annotations

from typing import Any

import torch

from fedexp.aggregators import (
    KNOWN,
    check_count,
    fixed_count,
    resolve_count,
    round_size,
    warn_once,
)
from fedexp.errors import ConfigError


def trimmed_mean(
    updates: torch.Tensor,
    weights: torch.Tensor,
    num_malicious: int = 0,
    *,
    beta: Any,
) -> torch.Tensor:
    """Trimmed mean of the rows of `updates`; unweighted (a client cannot buy weight).

    Args:
        updates: [n, d] client updates.
        weights: [n] client weights (not used).
        num_malicious: the round's true number of malicious uploads.
        beta: values dropped per side per coordinate: `known` (= num_malicious, as the FRL paper
            grants its baselines), an int count, or a float fraction of n. Capped so that at least
            one value per coordinate remains (refused before training when a fixed `beta` is
            capped in every round; a warning the first time `known` is).
    """
    n = updates.shape[0]
    wanted = resolve_count(beta, num_malicious, n, "beta")
    trim = min(wanted, (n - 1) // 2)
    if wanted > trim:
        warn_once(
            "trimmed_mean.beta",
            f"aggregator.beta: trimming {wanted} per side of {n} uploads would leave nothing; "
            f"trimmed {trim}",
        )
    if trim == 0:
        return updates.mean(0)
    ordered = torch.sort(updates, dim=0).values
    return ordered[trim : n - trim].mean(0)


def _check(beta: Any = KNOWN) -> None:
    check_count(beta, "beta")


def _check_round(cfg) -> None:
    n = round_size(cfg)
    beta = cfg.aggregator.get("beta", KNOWN)
    trim = fixed_count(beta, n)
    if trim is not None and trim > (n - 1) // 2:
        raise ConfigError(
            f"aggregator.beta: {beta} trims {trim} per side, leaving nothing of the {n} uploads "
            f"of a round (clients_per_round={n}); at most {(n - 1) // 2}"
        )


def _min_uploads(beta: Any = KNOWN) -> tuple[int, str] | None:
    """The uploads a round needs for a fixed count `beta` to trim in full (2 beta + 1), and why;
    None where the count scales with the round or is the round's malicious count."""
    if beta == KNOWN or isinstance(beta, bool) or not isinstance(beta, int):
        return None
    return 2 * beta + 1, f"aggregator.beta={beta} trims less (2 beta + 1 = {2 * beta + 1})"


trimmed_mean.check = _check
trimmed_mean.min_uploads = _min_uploads
trimmed_mean.check_config = _check_round
