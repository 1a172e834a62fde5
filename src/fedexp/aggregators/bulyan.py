"""Bulyan (El Mhamdi, Guerraoui and Rouault, "The Hidden Vulnerability of Distributed Learning in
Byzantium", ICML 2018), over Krum.

1. Selection: theta = n - 2f updates chosen by Krum again and again, each chosen update removed
   from the set before the next choice. Krum scores an update by the sum of squared distances to
   its n' - f - 2 nearest other updates (n' the updates still in the set; Blanchard et al.'s
   score), at least one (the set shrinks to 2f + 1, where n' - f - 2 < 1 for f = 1).
2. Per coordinate: the beta = theta - 2f selected values closest to the selection's median
   (the mean of the two middle values where theta is even), averaged.

The paper requires n >= 4f + 3 (then beta >= 3). A fixed f that a round of `clients_per_round`
uploads cannot honour is refused before training; `known` (the round's true malicious count) is
capped at (n - 3) // 4 in a round that has too many, with a warning.

Flower 1.42's `aggregate_bulyan` over `aggregate_krum` (to_keep=0) computes the same rule: its
Krum counts the same n' - f - 2 nearest others (at least one) in the shrinking set, its median
is numpy's. Where they can differ: ties. Here an equal Krum score goes to the earlier update and
an equal distance to the median to the earlier selected update (stable sort); Flower's Krum also
takes the earlier, but its coordinate phase uses `np.argpartition`, whose choice among equal
distances is unspecified (only a tie at the beta-th distance between different values changes
the result). tests/aggregators/test_bulyan.py compares the two on seeded inputs.
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
from fedexp.aggregators.median import median
from fedexp.aggregators.multikrum import krum_select
from fedexp.errors import ConfigError


def most_byzantine(n: int) -> int:
    """The largest f with n >= 4f + 3 (0 for n < 7)."""
    return max((n - 3) // 4, 0)


def bulyan(
    updates: torch.Tensor,
    weights: torch.Tensor,
    num_malicious: int = 0,
    *,
    f: Any,
) -> torch.Tensor:
    """Bulyan of the rows of `updates`; unweighted (a client cannot buy weight).

    Args:
        updates: [n, d] client updates.
        weights: [n] client weights (not used).
        num_malicious: the round's true number of malicious uploads.
        f: assumed number of malicious updates: `known` (= num_malicious), an int, or a fraction
            of n; capped at (n - 3) // 4 (n >= 4f + 3) with a warning.
    """
    n = updates.shape[0]
    wanted = resolve_count(f, num_malicious, n, "f")
    byzantine = min(wanted, most_byzantine(n))
    if wanted > byzantine:
        warn_once(
            "bulyan.f",
            f"aggregator.f: {wanted} of {n} uploads is more than Bulyan allows (n >= 4f + 3); "
            f"used f = {byzantine}",
        )
    theta = n - 2 * byzantine
    beta = theta - 2 * byzantine
    chosen = sorted(krum_select(updates, byzantine, theta))
    selected = updates[chosen]
    centre = median(selected, weights[chosen])
    order = torch.sort((selected - centre).abs(), dim=0, stable=True).indices[:beta]
    return torch.gather(selected, 0, order).mean(0)


def _check(f: Any = KNOWN) -> None:
    check_count(f, "f", max_fraction=0.25)


def _check_round(cfg) -> None:
    n = round_size(cfg)
    f = cfg.aggregator.get("f", KNOWN)
    byzantine = fixed_count(f, n)
    if byzantine is not None and n < 4 * byzantine + 3:
        raise ConfigError(
            f"aggregator.f: {f} means {byzantine} malicious of the {n} uploads of a round "
            f"(clients_per_round={n}); Bulyan needs clients_per_round >= 4f + 3 = "
            f"{4 * byzantine + 3}"
        )


def _min_uploads(f: Any = KNOWN) -> tuple[int, str] | None:
    """The uploads a round needs for a fixed count `f` (n >= 4f + 3), and why; None where the
    count scales with the round or is the round's malicious count."""
    if f == KNOWN or isinstance(f, bool) or not isinstance(f, int):
        return None
    need = 4 * f + 3
    return need, f"aggregator.f={f} was capped (Bulyan needs n >= {need})"


bulyan.check = _check
bulyan.min_uploads = _min_uploads
bulyan.check_config = _check_round
