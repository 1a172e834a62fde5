"""Partition schemes as components: the `_target_` of every `conf/partition/*.yaml`.

A scheme holds its own options and the data protocol shared by all schemes (`server_pool`,
`test_fraction`, `val_fraction`, `allow_missing_classes`, and for most `reduce_fraction` /
`reduce_factor`). The server pool is set aside by `fedexp.run.build_data` before the scheme is
called; the scheme keeps its size in the cache key.
Calling it partitions a training pool: the scheme's assignment (`fedexp.data.partition`), each
client's local train/validation/test split, the optional data reduction, and the on-disk cache
(keyed by the scheme's `name` and options, so a cached partition is reused across runs).
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from fedexp.data import partition as P
from fedexp.data.partition_cache import digest as _digest
from fedexp.data.partition_cache import load as _load
from fedexp.data.partition_cache import save as _save
from fedexp.errors import ConfigError

log = logging.getLogger(__name__)


def check_client_count(found: int, num_clients: int, clients_per_round: int) -> int:
    """A split with fewer clients than `num_clients` (a natural split with fewer owners) runs
    with the clients there are, and a `clients_per_round` above them samples every client each
    round; both said in one log line. Returns the clients a round samples."""
    if found >= num_clients:
        return clients_per_round
    per_round = min(clients_per_round, found)
    asked = (
        f" (clients_per_round={clients_per_round} asked)" if per_round < clients_per_round else ""
    )
    log.info(
        "partition: the data have %d eligible owners, fewer than num_clients=%d: running with "
        "%d clients, %d a round%s",
        found,
        num_clients,
        found,
        per_round,
        asked,
    )
    return per_round


class Scheme:
    """A partition scheme; subclasses name their options and implement `assign`.

    Args:
        options: the scheme's own options, passed to its assignment function (and cache key).
        server_pool: training samples set aside for the server before partitioning (the pool
            this scheme partitions is what remains).
        test_fraction: each client's local test split.
        val_fraction: each client's local validation split.
        allow_missing_classes: whether pooled test classes no client holds are allowed.
        reduce_fraction: the share of clients that keep only `reduce_factor` of their data.
        reduce_factor: the share of its training data a reduced client keeps.
    """

    name: ClassVar[str]
    uses_num_classes: ClassVar[bool] = False  # the assignment takes the dataset's class count
    reduces: ClassVar[bool] = True  # the scheme takes reduce_fraction / reduce_factor

    def __init__(
        self,
        options: dict[str, Any],
        /,
        *,
        server_pool: int,
        test_fraction: float,
        val_fraction: float,
        allow_missing_classes: bool,
        reduce_fraction: float,
        reduce_factor: float,
    ):
        self.options = options
        self.server_pool = server_pool
        self.test_fraction = test_fraction
        self.val_fraction = val_fraction
        self.allow_missing_classes = bool(allow_missing_classes)
        self.reduce_fraction = reduce_fraction
        self.reduce_factor = reduce_factor

    def assign(
        self,
        labels: np.ndarray,
        num_clients: int,
        rng: np.random.Generator,
        client_ids: np.ndarray | None,
        num_classes: int | None,
    ) -> list[np.ndarray] | tuple[list[np.ndarray], list[str]]:
        """One index array per client (and, for schemes with client groups, their labels)."""
        raise NotImplementedError

    def num_clients(self, num_clients: int, client_ids: np.ndarray | None) -> int:
        """How many clients the assignment makes (`num_clients` unless the scheme says)."""
        return num_clients

    def cache_params(self, num_classes: int | None) -> dict[str, Any]:
        """The options that decide the assignment (the cache key's `params`)."""
        params = dict(self.options)
        if self.reduces:
            params.update(reduce_fraction=self.reduce_fraction, reduce_factor=self.reduce_factor)
        if self.uses_num_classes:
            params["num_classes"] = num_classes
        return params

    def __call__(
        self,
        labels: np.ndarray,
        num_clients: int,
        seed: int,
        *,
        client_ids: np.ndarray | None = None,
        num_classes: int | None = None,
        cache_dir: str | Path | None = None,
        cache_key: dict | None = None,
    ) -> P.Partition:
        """Partition the training pool and split each client locally; cached under cache_dir.

        Args:
            labels: the training pool's labels.
            num_clients: how many clients to make.
            seed: the run's seed (the same seed gives the same index lists).
            client_ids: each sample's natural owner, for datasets that have one.
            num_classes: the dataset's class count (used by schemes with `uses_num_classes`).
            cache_dir: where partitions are cached; None: no cache.
            cache_key: what else identifies the pool (the dataset's config).
        """
        num_classes = num_classes if self.uses_num_classes else None
        params = self.cache_params(num_classes)
        key = dict(
            cache_key or {},
            scheme=self.name,
            params=params,
            num_clients=num_clients,
            seed=seed,
            server_pool=self.server_pool,
            test_fraction=self.test_fraction,
            val_fraction=self.val_fraction,
            n=len(labels),
            labels=_digest(labels),
            client_ids=None if client_ids is None else _digest(client_ids),
            version=P.PARTITION_VERSION,
        )
        path = None
        if cache_dir is not None:
            digest = hashlib.sha1(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()
            path = Path(cache_dir).expanduser() / "partitions" / f"{digest[:20]}.npz"
            cached = _load(path, self.num_clients(num_clients, client_ids), len(labels))
            if cached is not None:  # a missing or unreadable file is a miss, rewritten below
                return cached
        rng = np.random.default_rng([seed, 4242])
        parts = self.assign(labels, num_clients, rng, client_ids, num_classes)
        # a scheme with client groups (multimodal) returns (parts, group label per client)
        parts, groups = parts if isinstance(parts, tuple) else (parts, None)
        train, val, test = P.local_split(parts, self.test_fraction, rng, self.val_fraction)
        if self.reduces:
            train = P.reduce_clients(train, self.reduce_fraction, self.reduce_factor, seed)
        if len(train) and train.sizes.min() == 0:
            raise ConfigError(
                f"num_clients: {num_clients} clients leave some with no training data"
            )
        partition = P.Partition(train, test, groups, val if self.val_fraction > 0 else None)
        if path is not None:
            _save(path, partition)
        return partition


class Iid(Scheme):
    """Uniformly shuffled, near-equal split (`fedexp.data.partition.iid`)."""

    name = "iid"

    def __init__(self, **split):
        super().__init__({}, **split)

    def assign(self, labels, num_clients, rng, client_ids, num_classes):
        return P.iid(labels, num_clients, rng)


class Shards(Scheme):
    """McMahan et al.'s pathological non-iid split (`fedexp.data.partition.shards`)."""

    name = "shards"
    uses_num_classes = True

    def __init__(self, classes_per_client: int, exact: bool, **split):
        super().__init__(dict(classes_per_client=classes_per_client, exact=exact), **split)

    def assign(self, labels, num_clients, rng, client_ids, num_classes):
        return P.shards(labels, num_clients, rng, num_classes=num_classes, **self.options)


class Dirichlet(Scheme):
    """Per class, client shares ~ Dir(beta) (`fedexp.data.partition.dirichlet`)."""

    name = "dirichlet"

    def __init__(self, beta: float, min_size: int, max_retries: int, **split):
        super().__init__(dict(beta=beta, min_size=min_size, max_retries=max_retries), **split)

    def assign(self, labels, num_clients, rng, client_ids, num_classes):
        return P.dirichlet(labels, num_clients, rng, **self.options)


class Natural(Scheme):
    """One client per natural owner (`fedexp.data.partition.natural`)."""

    name = "natural"

    def __init__(self, min_samples: int, max_clients: int | None, **split):
        super().__init__(dict(min_samples=min_samples, max_clients=max_clients), **split)

    def num_clients(self, num_clients, client_ids):
        return P.natural_clients(num_clients, client_ids, **self.options)

    def assign(self, labels, num_clients, rng, client_ids, num_classes):
        return P.natural(labels, num_clients, rng, client_ids=client_ids, **self.options)


class Multimodal(Scheme):
    """WAFFLe's two client groups with disjoint classes (`fedexp.data.partition.multimodal`);
    every client holds the same number of samples, so the data reduction does not apply."""

    name = "multimodal"
    reduces = False

    def __init__(
        self,
        classes_per_client: int,
        group_ratio: int,
        majority_classes: list[int] | None,
        minority_classes: list[int] | None,
        samples_per_client: int | None,
        server_pool: int,
        test_fraction: float,
        val_fraction: float,
        allow_missing_classes: bool,
    ):
        options = dict(
            classes_per_client=classes_per_client,
            group_ratio=group_ratio,
            majority_classes=majority_classes,
            minority_classes=minority_classes,
            samples_per_client=samples_per_client,
        )
        super().__init__(
            options,
            server_pool=server_pool,
            test_fraction=test_fraction,
            val_fraction=val_fraction,
            allow_missing_classes=allow_missing_classes,
            reduce_fraction=0.0,
            reduce_factor=1.0,
        )

    def assign(self, labels, num_clients, rng, client_ids, num_classes):
        return P.multimodal(labels, num_clients, rng, **self.options)
