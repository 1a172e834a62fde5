"""Dealing classes and label-sorted shards to clients (the `shards` and `multimodal` schemes).

McMahan et al. sort the pool by label, cut num_clients * Z shards and deal them at random, so
the clients' class sets are as varied as a random draw. `deal_classes` keeps that variety while
guaranteeing every client Z *distinct* classes and every class a share of the N * Z slots that
differs from any other class's by at most one. `blind_shards` is the original cut, kept for exact
reproduction of papers that used it.
"""

from __future__ import annotations

import numpy as np

from fedexp.errors import ConfigError


def deal_classes(
    classes: np.ndarray, num_clients: int, z: int, rng: np.random.Generator
) -> list[np.ndarray]:
    """A random deal of Z distinct classes to each client, balanced over the classes.

    The N * Z class slots are split over the classes as evenly as possible (the classes that get
    one slot more are drawn at random). Clients then draw, in random order, Z distinct classes
    with probability proportional to the slots each class has left (a random deal of the slots,
    conditioned on no client drawing one class twice). A class with as many slots left as there
    are clients left must go to the current client; this keeps every later client's draw
    feasible, so the deal always completes in one pass (no retries, no repair).

    Args:
        classes: The class labels to deal (C of them, z <= C).
        num_clients: N, the number of clients.
        z: Classes per client.
        rng: Source of all randomness.

    Returns:
        For each client, its Z distinct classes in ascending order.
    """
    n_classes = len(classes)
    if not 1 <= z <= n_classes:
        raise ConfigError(f"partition.classes_per_client: must be in 1..{n_classes}, got {z}")
    base, extra = divmod(num_clients * z, n_classes)
    left = np.full(n_classes, base, dtype=np.int64)
    left[rng.choice(n_classes, extra, replace=False)] += 1
    sets: list[np.ndarray] = [np.empty(0, dtype=np.asarray(classes).dtype)] * num_clients
    for clients_left, client in zip(range(num_clients, 0, -1), rng.permutation(num_clients)):
        # invariant: sum(left) == clients_left * z and max(left) <= clients_left, so at most z
        # classes are forced and at least z classes have slots left
        forced = np.flatnonzero(left == clients_left)
        free = np.flatnonzero((left > 0) & (left < clients_left))
        k = z - len(forced)
        drawn = rng.choice(free, k, replace=False, p=left[free] / left[free].sum()) if k else []
        chosen = np.sort(np.concatenate([forced, np.asarray(drawn, dtype=np.int64)]))
        left[chosen] -= 1
        sets[client] = np.asarray(classes)[chosen]
    return sets


def blind_shards(
    labels: np.ndarray, num_clients: int, z: int, rng: np.random.Generator
) -> list[np.ndarray]:
    """McMahan et al.'s original cut: sort by label, cut N * Z equal shards, deal them at random.

    Shards have len(labels) // (N * Z) samples (the remainder of the sorted pool is unused); a
    shard may straddle two classes and a client may get two shards of one class, so a client
    can hold fewer or more than Z classes.

    Args:
        labels: The training pool's labels.
        num_clients: N, the number of clients.
        z: Shards per client.
        rng: Source of the deal.

    Returns:
        Each client's sorted sample indices.
    """
    n_shards = num_clients * z
    size = len(labels) // n_shards
    if size < 1:
        raise ConfigError(
            f"partition.classes_per_client: {n_shards} shards of {len(labels)} samples leave "
            "some empty; use fewer clients or classes per client"
        )
    by_label = np.argsort(labels, kind="stable")
    deal = rng.permutation(n_shards).reshape(num_clients, z)
    return [
        np.sort(np.concatenate([by_label[s * size : (s + 1) * size] for s in row])) for row in deal
    ]
