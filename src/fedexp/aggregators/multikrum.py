"""Multi-Krum (Blanchard et al., 2017).

Score each update by the sum of squared distances to its n'-f-2 nearest *other* updates (n' the
updates not yet selected; Blanchard's score), select the lowest score, remove it, repeat; average
the selected ones. The number selected, n - 2f - 2, follows the FRL/NDSS'21 reference code, whose
score differs slightly: it sums the first n-f-2 sorted distances *including* the zero distance of
an update to itself (n-f-3 others).
"""

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


def pairwise_sq_distances(updates: torch.Tensor) -> torch.Tensor:
    """[n, n] squared Euclidean distances from exact differences, one row at a time (memory n*d,
    no cancellation from the |a|^2 + |b|^2 - 2ab expansion)."""
    return torch.stack([((updates - row) ** 2).sum(1) for row in updates])


def krum_select(updates: torch.Tensor, f: int, num_selected: int) -> list[int]:
    """Indices chosen by repeated Krum selection, in the order they are chosen."""
    dist = pairwise_sq_distances(updates)
    remaining = list(range(updates.shape[0]))
    chosen: list[int] = []
    while remaining and len(chosen) < num_selected:
        sub = dist[remaining][:, remaining]
        neighbours = max(len(remaining) - f - 2, 1)
        # drop the zero self-distance (first after sorting), keep the nearest others
        nearest = torch.sort(sub, dim=1).values[:, 1 : 1 + neighbours]
        best = int(torch.argmin(nearest.sum(1)))  # ties: the earlier update
        chosen.append(remaining.pop(best))
    return chosen


def selection_size(n: int, f: int, num_selected: int | None) -> int:
    """Default n - 2f - 2 (the reference code selects while more than 2f + 2 remain), >= 1."""
    size = n - 2 * f - 2 if num_selected is None else num_selected
    return max(1, min(size, n))


def multikrum(
    updates: torch.Tensor,
    weights: torch.Tensor,
    num_malicious: int = 0,
    *,
    f: Any,
    num_selected: int | None,
) -> torch.Tensor:
    """Unweighted mean of the updates Multi-Krum selects.

    Args:
        updates: [n, d] client updates.
        weights: [n] client weights (not used: a client cannot buy weight).
        num_malicious: the round's true number of malicious uploads.
        f: assumed number of malicious updates: `known` (= num_malicious), an int, or a fraction.
        num_selected: how many to select; None = n - 2f - 2 (at least 1).
    """
    n = updates.shape[0]
    byzantine = resolve_count(f, num_malicious, n, "f")
    if n - byzantine - 2 < 1 or (num_selected is None and n - 2 * byzantine - 2 < 1):
        warn_once(
            "multikrum.f",
            f"aggregator.f: {byzantine} of {n} uploads is more than Multi-Krum allows "
            f"(n > 2f + 2); its neighbour count and selection were capped",
        )
    chosen = krum_select(updates, byzantine, selection_size(n, byzantine, num_selected))
    return updates[sorted(chosen)].mean(0)


def _check(f: Any = KNOWN, num_selected: int | None = None) -> None:
    check_count(f, "f")
    if num_selected is not None and (not isinstance(num_selected, int) or num_selected < 1):
        raise ConfigError(
            f"aggregator.num_selected: must be null or an int >= 1, got {num_selected}"
        )


def _check_round(cfg) -> None:
    n = round_size(cfg)
    f = cfg.aggregator.get("f", KNOWN)
    num_selected = cfg.aggregator.get("num_selected")
    byzantine = fixed_count(f, n)
    if num_selected is not None and isinstance(num_selected, int) and num_selected > n:
        raise ConfigError(
            f"aggregator.num_selected: {num_selected} > the {n} uploads of a round "
            f"(clients_per_round={n})"
        )
    if byzantine is None:
        return
    if n - byzantine - 2 < 1 or (num_selected is None and n - 2 * byzantine - 2 < 1):
        raise ConfigError(
            f"aggregator.f: {f} means {byzantine} malicious of the {n} uploads of a round "
            f"(clients_per_round={n}); Multi-Krum needs clients_per_round > 2f + 2"
        )


def _min_uploads(f: Any = KNOWN, num_selected: int | None = None) -> tuple[int, str] | None:
    """The uploads a round needs for a fixed count `f` as Multi-Krum assumes it (n > 2f + 2;
    n > f + 2 with `num_selected` set), and why; None where the count scales with the round or
    is the round's malicious count."""
    if f == KNOWN or isinstance(f, bool) or not isinstance(f, int):
        return None
    need = (f + 3) if num_selected is not None else (2 * f + 3)
    return need, f"aggregator.f={f} was capped (Multi-Krum needs n >= {need})"


multikrum.check = _check
multikrum.min_uploads = _min_uploads
multikrum.check_config = _check_round
