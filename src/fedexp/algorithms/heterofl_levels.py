"""HeteroFL's options, its clients' capability levels and its overlap aggregation.

Levels (the paper's "a-b-c-d-e" model complexity levels): `rates` lists the width rate of each
level, relative to the model's widths (rate 1: the global network itself); `proportions` the
share of the clients at each. Two assignments, the reference code's `model_split_mode`:

- `fixed` ("fix"): each client one level for the whole run. Level i gets floor(N p_i / sum p)
  clients, the clients left over go one each to the levels with the largest remainders (lower
  level first on a tie; the reference code gives them all to the last level), and which clients
  get which level is a permutation drawn from the run's seed (`LEVEL_STREAM`), so that a level
  is no function of how the partition numbered the clients;
- `dynamic`: each round each sampled client's level is drawn anew, level i with probability
  p_i / sum p, from (seed, round, client) (`dynamic_level`): the mode of the paper's tables of
  level combinations.

`rates: family` takes each client's level from its architecture in a model family instead
(`fedexp.algorithms.heterofl`).

Aggregation (Sec. 3.1 and the reference code's `combine`): each entry of the global network is the
mean of the clients whose sub-model holds it, weighted by `weighting` (uniform, the reference
code's count, or samples); an entry no client of the round holds keeps its value. With
`head_aggregation: held_labels` (the reference code) a client's head rows (weights and bias) of
the classes it holds no sample of count as not held.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from fedexp.aggregators.mean import weighted_mean
from fedexp.core.seeding import derive_seed
from fedexp.core.types import ConfigError

LEVEL_STREAM = 79  # derive_seed tag of the permutation that assigns clients to levels
NORMS = ("none", "sbn")
ASSIGNMENTS = ("fixed", "dynamic")
HEAD_AGGREGATIONS = ("held_labels", "all")
MEAN = "fedexp.aggregators.mean.weighted_mean"


def check_options(rates, proportions, assignment: str, norm: str, head_aggregation: str) -> None:
    """A ConfigError (one line, naming the key) for an option HeteroFL cannot run with."""
    if assignment not in ASSIGNMENTS:
        raise ConfigError(f"algorithm.assignment: must be fixed or dynamic, got {assignment!r}")
    if isinstance(rates, str):
        if rates != "family":
            raise ConfigError(
                f"algorithm.rates: a list of rates in (0, 1] or family, got {rates!r}"
            )
        if assignment != "fixed":
            raise ConfigError(
                "algorithm.assignment: rates=family keeps each client's architecture for the "
                "run; use assignment=fixed"
            )
    else:
        rates = list(rates)
        if not rates:
            raise ConfigError("algorithm.rates: give at least one rate")
        bad = [r for r in rates if isinstance(r, bool) or not 0 < r <= 1]
        if bad:
            raise ConfigError(f"algorithm.rates: every rate must be in (0, 1], got {bad[0]!r}")
        if len(set(rates)) < len(rates):
            raise ConfigError(f"algorithm.rates: each rate once, got {rates}")
        shares = list(proportions)
        if len(shares) != len(rates):
            raise ConfigError(
                f"algorithm.proportions: one per rate ({len(rates)}), got {len(shares)}"
            )
        if any(isinstance(p, bool) or p < 0 for p in shares) or sum(shares) <= 0:
            raise ConfigError(
                f"algorithm.proportions: numbers >= 0 with a positive sum, got {shares}"
            )
    if norm not in NORMS:
        raise ConfigError(f"algorithm.norm: must be none or sbn, got {norm!r}")
    if head_aggregation not in HEAD_AGGREGATIONS:
        raise ConfigError(
            f"algorithm.head_aggregation: must be held_labels or all, got {head_aggregation!r}"
        )


def check_aggregator(target: str | None) -> None:
    """HeteroFL averages each entry over the clients holding it: the mean aggregator only."""
    if target is not None and target != MEAN:
        name = target.rsplit(".", 1)[-1]
        raise ConfigError(
            "aggregator: algorithm=heterofl averages each entry over the clients whose "
            f"sub-model holds it; use aggregator=mean, got {name}"
        )


def level_counts(num_clients: int, proportions: Sequence[float]) -> list[int]:
    """Clients per level: floor(N p_i / sum p), the rest one each by largest remainder."""
    shares = np.asarray(proportions, dtype=np.float64)
    exact = num_clients * shares / shares.sum()
    counts = np.floor(exact + 1e-9).astype(int)
    left = num_clients - int(counts.sum())
    order = sorted(range(len(shares)), key=lambda i: (-(exact[i] - counts[i]), i))
    for i in order[:left]:
        counts[i] += 1
    return [int(c) for c in counts]


def assign_levels(seed: int, num_clients: int, proportions: Sequence[float]) -> list[int]:
    """Each client's level, fixed for the run: `level_counts` of each, over a seeded
    permutation of the client ids."""
    labels = np.repeat(np.arange(len(proportions)), level_counts(num_clients, proportions))
    order = np.random.default_rng(derive_seed(seed, LEVEL_STREAM)).permutation(num_clients)
    levels = np.empty(num_clients, dtype=np.int64)
    levels[order] = labels
    return [int(v) for v in levels]


def dynamic_level(seed: int, round_idx: int, client_id: int, proportions: Sequence[float]) -> int:
    """The client's level in round `round_idx` under `assignment: dynamic`: level i with
    probability p_i / sum p, on the stream of (seed, round, client)."""
    shares = np.asarray(proportions, dtype=np.float64)
    rng = np.random.default_rng(derive_seed(seed, LEVEL_STREAM, round_idx, client_id))
    return int(rng.choice(len(shares), p=shares / shares.sum()))


def held_labels(labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """The classes a client holds a training sample of, as a bool mask [num_classes]."""
    return torch.bincount(labels.reshape(-1).long(), minlength=num_classes)[:num_classes] > 0


def coverage(
    levels: Sequence[int],
    level_cover: Sequence[torch.Tensor],
    held: torch.Tensor | None,
    head_class: torch.Tensor,
) -> torch.Tensor:
    """[K, d] bool: which entries of the global network each client's upload counts for: those
    its level's sub-model holds, less (with `held` [K, classes]) the head rows of the classes
    the client holds no sample of."""
    cover = torch.stack([level_cover[level] for level in levels])
    if held is not None:
        rows = head_class >= 0
        cover[:, rows] &= held[:, head_class[rows]]
    return cover


def overlap_mean(updates: torch.Tensor, cover: torch.Tensor, weights: torch.Tensor):
    """Entry j: sum_k w_k c_kj u_kj / sum_k w_k c_kj over the clients k whose upload covers it
    (`cover` [K, d]); 0 where none does. Where every upload covers every entry this is FedAvg's
    weighted mean itself (the same operations, so the same floats)."""
    if bool(cover.all()):
        return weighted_mean(updates, weights)
    w = weights.to(updates.dtype)[:, None] * cover.to(updates.dtype)
    total = w.sum(0)
    held = total > 0
    # an entry a client does not hold is left out, whatever its upload carries there
    summed = (w * torch.where(cover, updates, 0.0)).sum(0)
    return torch.where(held, summed / torch.where(held, total, 1.0), 0.0)
