"""Data an algorithm needs on the server, reserved out of every client's reach before partitioning.

An algorithm declares it on its `_target_` (a class or a factory function):
`server_data(cfg) -> ServerDataRequest | None`, read from its own config section. The run wiring
(`fedexp.run.build_data`) calls it and moves that many random training samples into
`dataset.server_x` before the partition sees the pool. FedHeNN's rad_source=holdout draws its
RAD from such a pool (`algorithm.server_pool`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedexp.errors import ConfigError


@dataclass(frozen=True)
class ServerDataRequest:
    """What an algorithm asks the server to hold.

    Attributes:
        size: training samples moved into the server pool (0: none).
        key: the config key that sets it, named in errors (e.g. `algorithm.server_pool`).
    """

    size: int
    key: str


def reserve_server_pool(dataset, size: int, seed: int, key: str = "server_pool"):
    """Move `size` random training samples out of every client's reach into a server pool."""
    if size <= 0:
        return dataset
    n = len(dataset.train_y)
    if size >= n:
        raise ConfigError(f"{key}: {size} >= the {n} training samples")
    perm = np.random.default_rng([seed, 31337]).permutation(n)
    pool, keep = np.sort(perm[:size]), np.sort(perm[size:])
    dataset.server_x = dataset.train_x[pool]
    dataset.train_x, dataset.train_y = dataset.train_x[keep], dataset.train_y[keep]
    if dataset.train_client_ids is not None:
        dataset.train_client_ids = dataset.train_client_ids[keep]
    return dataset
