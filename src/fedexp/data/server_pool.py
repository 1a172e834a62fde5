"""The server pool: training samples set aside before partitioning, out of every client's reach.

`partition.server_pool` (conf/partition/_split.yaml) is part of the data protocol, the same for
every algorithm, so that all methods of a comparison see identical client data. `fedexp.run.
build_data` moves that many random training samples into `dataset.server_x` and their labels
into `dataset.server_y` before the partition sees the training set. FedHeNN draws its
Representation Alignment Dataset from the pool's inputs (`algorithm.rad_source=server`; it reads
no label); FLTrust's server trains its update on inputs and labels (`aggregator=fltrust`, the
paper's root dataset).
"""

from __future__ import annotations

import numpy as np

from fedexp.errors import ConfigError

POOL_STREAM = 31337  # the pool's own random stream, apart from the partition's


def reserve_server_pool(dataset, size: int, seed: int, key: str = "partition.server_pool"):
    """Move `size` random training samples out of every client's reach into a server pool."""
    if size <= 0:
        return dataset
    n = len(dataset.train_y)
    if size >= n:
        raise ConfigError(
            f"{key}: {size} >= the {n} training samples of {dataset.name}; lower it (0: no pool)"
        )
    perm = np.random.default_rng([seed, POOL_STREAM]).permutation(n)
    pool, keep = np.sort(perm[:size]), np.sort(perm[size:])
    dataset.server_x, dataset.server_y = dataset.train_x[pool], dataset.train_y[pool]
    dataset.train_x, dataset.train_y = dataset.train_x[keep], dataset.train_y[keep]
    if dataset.train_client_ids is not None:
        dataset.train_client_ids = dataset.train_client_ids[keep]
    return dataset
