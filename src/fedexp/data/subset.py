"""`dataset.max_samples`: a seeded random subset of at most that many training samples, and as
many test samples, taken right after the loader returns, before the server pool and the
partition (`fedexp.run.build_data`); `debug=smoke` sets it so that any dataset's smoke run
partitions, trains and evaluates on a small subset.

The key is read by fedexp, not passed to the loader, so it works for every dataset, a custom
`dataset._target_` included. Where the data have natural owners (writers, users), the training
subset keeps whole owners: owners in a seeded random order, as many as fit in the cap, and never
fewer than `num_clients` (a natural split keeps its clients).
"""

from __future__ import annotations

import dataclasses
import logging

import numpy as np

from fedexp.data.datasets import Dataset

KEY = "max_samples"
STREAM = 2718  # the subset's random stream, apart from the partition's and the holdout's
log = logging.getLogger(__name__)


def cap_samples(dataset: Dataset, max_samples: int | None, seed: int, num_clients: int) -> Dataset:
    """`dataset` with at most `max_samples` training and test samples (None: as it is)."""
    if max_samples is None:
        return dataset
    rng = np.random.default_rng([seed, STREAM])
    n = len(dataset.train_y)
    owners = dataset.train_client_ids
    if owners is None:
        train = _rows(n, max_samples, rng)
    else:
        train = _owner_rows(owners, max_samples, num_clients, rng)
    test = None
    if dataset.test_y is not None:
        test = _rows(len(dataset.test_y), max_samples, rng)
    if train is None and test is None:
        return dataset
    kept = dataclasses.replace(
        dataset,
        train_x=dataset.train_x[train] if train is not None else dataset.train_x,
        train_y=dataset.train_y[train] if train is not None else dataset.train_y,
        test_x=dataset.test_x[test] if test is not None else dataset.test_x,
        test_y=dataset.test_y[test] if test is not None else dataset.test_y,
        train_client_ids=owners[train] if owners is not None and train is not None else owners,
    )
    log.info(
        "dataset.max_samples=%d: %d of %d training samples%s kept",
        max_samples,
        len(kept.train_y),
        n,
        f", {len(kept.test_y)} of {len(dataset.test_y)} test samples" if test is not None else "",
    )
    return kept


def _rows(n: int, cap: int, rng: np.random.Generator) -> np.ndarray | None:
    """A sorted random `cap` of range(n), or None when n <= cap (everything kept)."""
    if n <= cap:
        return None
    return np.sort(rng.choice(n, cap, replace=False))


def _owner_rows(owners: np.ndarray, cap: int, num_clients: int, rng) -> np.ndarray | None:
    """The rows of whole owners in a random order, as many owners as fit in `cap` (at least
    `num_clients` of them), in their original order; None when every owner is kept."""
    ids, counts = np.unique(owners, return_counts=True)
    order = rng.permutation(len(ids))
    total = np.cumsum(counts[order])
    keep = max(int(np.searchsorted(total, cap, side="right")), num_clients, 1)
    if keep >= len(ids):
        return None
    return np.flatnonzero(np.isin(owners, ids[order[:keep]]))
