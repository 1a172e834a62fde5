"""Partitions: split a labelled training pool into client index sets.

Each scheme is a pure function of (labels, num_clients, rng, params) returning one index array per
client. `partition_dataset` adds the per-client local train/test split and caches the result.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedexp.data.class_deal import blind_shards, deal_classes
from fedexp.data.partition_cache import digest as _digest
from fedexp.data.partition_cache import load as _load
from fedexp.data.partition_cache import save as _save
from fedexp.errors import ConfigError

# bump when a scheme's output for the same inputs changes: older cached partitions are not reused
PARTITION_VERSION = 2


@dataclass
class Partition:
    """Per-client index arrays into the dataset's training pool."""

    train: list[np.ndarray]
    test: list[np.ndarray]
    groups: list[str] | None = None
    val: list[np.ndarray] | None = None  # local validation splits (None: no validation split)

    @property
    def num_clients(self) -> int:
        return len(self.train)


def iid(labels: np.ndarray, num_clients: int, rng: np.random.Generator, **_) -> list[np.ndarray]:
    """Uniformly shuffled, near-equal split."""
    return [np.sort(p) for p in np.array_split(rng.permutation(len(labels)), num_clients)]


def shards(
    labels: np.ndarray,
    num_clients: int,
    rng: np.random.Generator,
    classes_per_client: int = 2,
    num_classes: int | None = None,
    exact: bool = True,
    **_,
) -> list[np.ndarray]:
    """McMahan et al.'s pathological non-iid split.

    exact=True (default): every client gets Z *distinct* classes drawn by a random, class-balanced
    deal (`deal_classes`: class sets as varied as McMahan's random deal of shards); each class is
    cut into as many near-equal shards as it has clients (shard counts per class differ by at
    most one across classes) and each sample is used at most once. exact=False: the original
    blind cut of the label-sorted pool into N * Z equal shards dealt at random
    (`blind_shards`), where a client may get fewer or more than Z classes.
    """
    z = classes_per_client
    if isinstance(z, bool) or not isinstance(z, int) or z < 1:
        raise ConfigError(f"partition.classes_per_client: must be an integer >= 1, got {z!r}")
    if not isinstance(exact, bool):
        raise ConfigError(f"partition.exact: must be true or false, got {exact!r}")
    if not exact:
        return blind_shards(labels, num_clients, z, rng)
    classes = np.unique(labels) if num_classes is None else np.arange(num_classes)
    if z > len(classes):
        raise ConfigError(
            f"partition.classes_per_client: {z} exceeds the dataset's {len(classes)} classes"
        )
    slots: dict[int, list[int]] = {int(c): [] for c in classes}
    for client, class_set in enumerate(deal_classes(classes, num_clients, z, rng)):
        for cls in class_set:
            slots[int(cls)].append(client)
    parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for cls, owners in slots.items():
        if not owners:
            continue
        members = rng.permutation(np.flatnonzero(labels == cls))
        if len(members) < len(owners):
            raise ConfigError(
                f"partition.classes_per_client: class {cls} has {len(members)} samples for "
                f"{len(owners)} shards; use fewer clients or classes per client"
            )
        # a random owner gets each of the (one sample) larger shards
        for owner, shard in zip(rng.permutation(owners), np.array_split(members, len(owners))):
            parts[owner].append(shard)
    return [np.sort(np.concatenate(p)) for p in parts]


def dirichlet(
    labels: np.ndarray,
    num_clients: int,
    rng: np.random.Generator,
    beta: float = 0.5,
    min_size: int = 10,
    max_retries: int = 100,
    **_,
) -> list[np.ndarray]:
    """Per class, client shares ~ Dir(beta); redrawn until every client has min_size samples."""
    if beta <= 0:
        raise ConfigError(f"partition.beta: must be > 0, got {beta}")
    classes = np.unique(labels)
    for _attempt in range(max_retries):
        parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
        for cls in classes:
            members = rng.permutation(np.flatnonzero(labels == cls))
            props = rng.dirichlet(np.full(num_clients, beta))
            cuts = (np.cumsum(props)[:-1] * len(members)).astype(int)
            for client, chunk in enumerate(np.split(members, cuts)):
                parts[client].append(chunk)
        out = [np.sort(np.concatenate(p)) for p in parts]
        if min(len(p) for p in out) >= min_size:
            return out
    raise ConfigError(
        f"partition.min_size: no Dirichlet(beta={beta}) draw gave every one of {num_clients} "
        f"clients {min_size} samples in {max_retries} tries; lower min_size or num_clients"
    )


def natural(
    labels: np.ndarray,
    num_clients: int,
    rng: np.random.Generator,
    client_ids: np.ndarray | None = None,
    min_samples: int = 0,
    max_clients: int | None = None,
    **_,
) -> list[np.ndarray]:
    """One client per natural owner (writer, user, generating client), in owner order.

    Owners with fewer than `min_samples` samples are dropped; if more than `max_clients` remain,
    a seeded random subset of that many is kept (LEAF samples users the same way). The result
    must have exactly `num_clients` owners (the YAML default `max_clients: ${num_clients}` makes
    `num_clients=N` pick N of them).
    """
    if client_ids is None:
        raise ConfigError(
            "partition: natural split needs a dataset with client ids (writers, users: femnist, "
            "sent140, synthetic); use partition=iid, shards or dirichlet for this dataset"
        )
    owners, counts = np.unique(client_ids, return_counts=True)
    eligible = np.flatnonzero(counts >= min_samples)
    if max_clients is not None and len(eligible) > max_clients:
        eligible = np.sort(rng.choice(eligible, max_clients, replace=False))
    if num_clients != len(eligible):
        raise ConfigError(
            f"num_clients: the natural split has {len(eligible)} clients (owners with >= "
            f"{min_samples} samples, at most partition.max_clients={max_clients}), "
            f"got {num_clients}"
        )
    # group sample indices by owner in one sort (a mask per owner is quadratic for FEMNIST)
    order = np.argsort(np.searchsorted(owners, client_ids), kind="stable")
    groups = np.split(order, np.cumsum(counts)[:-1])
    return [groups[o] for o in eligible]


def multimodal(
    labels: np.ndarray,
    num_clients: int,
    rng: np.random.Generator,
    classes_per_client: int = 2,
    group_ratio: int = 5,
    majority_classes: list[int] | None = None,
    minority_classes: list[int] | None = None,
    samples_per_client: int | None = None,
    num_classes: int | None = None,
    **_,
) -> tuple[list[np.ndarray], list[str]]:
    """WAFFLe's multimodal non-iid split: two client groups with disjoint class sets.

    round(num_clients / (group_ratio + 1)) clients (chosen at random) form the minority, the
    rest the majority; by default the majority holds the odd classes and the minority the even
    ones. Within its group each client holds `classes_per_client` distinct classes, every client
    the same number of samples (an equal shard per class: `samples_per_client`, or the largest
    that every class can supply); samples left over are unused. Returns (parts, group labels).
    """
    z = classes_per_client
    classes = np.arange(num_classes) if num_classes is not None else np.unique(labels)
    major = np.array(
        [c for c in classes if c % 2 == 1] if majority_classes is None else majority_classes
    )
    minor = np.array(
        [c for c in classes if c % 2 == 0] if minority_classes is None else minority_classes
    )
    if set(major.tolist()) & set(minor.tolist()):
        raise ConfigError("partition.majority_classes: must be disjoint from minority_classes")
    num_minority = int(round(num_clients / (group_ratio + 1)))
    if group_ratio < 1 or not 1 <= num_minority < num_clients:
        raise ConfigError(
            f"partition.group_ratio: {group_ratio} with {num_clients} clients leaves a group empty"
        )
    if z > min(len(major), len(minor)):
        raise ConfigError(f"partition.classes_per_client: {z} exceeds a group's class count")
    is_minority = np.zeros(num_clients, dtype=bool)
    is_minority[rng.choice(num_clients, num_minority, replace=False)] = True
    # class slots: within each group, a random class-balanced deal of z distinct classes
    slots: dict[int, list[int]] = {}
    for group_classes, members in (
        (major, np.flatnonzero(~is_minority)),
        (minor, np.flatnonzero(is_minority)),
    ):
        for client, class_set in zip(members, deal_classes(group_classes, len(members), z, rng)):
            for cls in class_set:
                slots.setdefault(int(cls), []).append(int(client))
    pools = {c: rng.permutation(np.flatnonzero(labels == c)) for c in slots}
    largest = min(len(pools[c]) // len(owners) for c, owners in slots.items())
    shard = largest if samples_per_client is None else samples_per_client // z
    if shard < 1 or shard > largest:
        raise ConfigError(
            f"partition.samples_per_client: {samples_per_client} needs shards of {shard}; "
            f"the classes allow 1..{largest} per class ({largest * z} per client)"
        )
    parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for cls, owners in slots.items():
        for i, owner in enumerate(owners):
            parts[owner].append(pools[cls][i * shard : (i + 1) * shard])
    groups = ["minority" if m else "majority" for m in is_minority]
    return [np.sort(np.concatenate(p)) for p in parts], groups


SCHEMES: dict[str, Callable[..., list[np.ndarray] | tuple[list[np.ndarray], list[str]]]] = {
    "iid": iid,
    "shards": shards,
    "dirichlet": dirichlet,
    "natural": natural,
    "multimodal": multimodal,
}


def local_split(
    parts: list[np.ndarray],
    test_fraction: float,
    rng: np.random.Generator,
    val_fraction: float = 0.0,
) -> tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray]]:
    """Split each client's indices into local train/validation/test.

    A client with at least two samples keeps at least one test sample (if `test_fraction` > 0);
    one with at least three keeps at least one validation sample too (if `val_fraction` > 0), and
    at least one training sample always. The test split is drawn first, from the same permutation,
    so `val_fraction=0` leaves the train/test split exactly as it was without validation.
    """
    train, val, test = [], [], []
    for p in parts:
        perm = rng.permutation(p)
        n_test = int(round(test_fraction * len(p)))
        if test_fraction > 0 and len(p) >= 2:
            n_test = max(1, n_test)
        n_val = int(round(val_fraction * len(p)))
        if val_fraction > 0 and len(p) >= 3:
            n_val = max(1, n_val)
        n_val = max(0, min(n_val, len(p) - n_test - 1))
        test.append(np.sort(perm[:n_test]))
        val.append(np.sort(perm[n_test : n_test + n_val]))
        train.append(np.sort(perm[n_test + n_val :]))
    return train, val, test


def reduce_clients(
    train: list[np.ndarray], fraction: float, factor: float, seed: int
) -> list[np.ndarray]:
    """A random `fraction` of the clients keeps a random `factor` of its training samples.

    FedHeNN's sensitivity study (halve the data of 0-100 % of the clients). Local test splits
    are untouched; its own stream leaves every partition with fraction 0 as it was.
    """
    if not 0 <= fraction <= 1:
        raise ConfigError(f"partition.reduce_fraction: must be in [0, 1], got {fraction}")
    if not 0 < factor <= 1:
        raise ConfigError(f"partition.reduce_factor: must be in (0, 1], got {factor}")
    if fraction == 0 or factor == 1:
        return train
    rng = np.random.default_rng([seed, 5151])
    chosen = rng.choice(len(train), int(round(fraction * len(train))), replace=False)
    out = list(train)
    for c in np.sort(chosen):
        keep = max(1, int(round(factor * len(out[c]))))
        out[c] = np.sort(rng.choice(out[c], keep, replace=False))
    return out


def partition_dataset(
    labels: np.ndarray,
    num_clients: int,
    scheme: str,
    seed: int,
    params: dict,
    client_ids: np.ndarray | None = None,
    test_fraction: float = 0.2,
    val_fraction: float = 0.0,
    cache_dir: str | Path | None = None,
    cache_key: dict | None = None,
) -> Partition:
    """Partition the training pool and split each client locally; cached under cache_dir."""
    if scheme not in SCHEMES:
        raise ConfigError(f"partition.name: unknown scheme {scheme!r}; one of {sorted(SCHEMES)}")
    key = dict(
        cache_key or {},
        scheme=scheme,
        params=params,
        num_clients=num_clients,
        seed=seed,
        test_fraction=test_fraction,
        val_fraction=val_fraction,
        n=len(labels),
        labels=_digest(labels),
        client_ids=None if client_ids is None else _digest(client_ids),
        version=PARTITION_VERSION,
    )
    path = None
    if cache_dir is not None:
        digest = hashlib.sha1(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()
        path = Path(cache_dir).expanduser() / "partitions" / f"{digest[:20]}.npz"
        cached = _load(path, num_clients, len(labels))
        if cached is not None:  # a missing or unreadable file is a miss, rewritten below
            return cached
    params = dict(params)
    reduce_fraction = float(params.pop("reduce_fraction", 0.0))
    reduce_factor = float(params.pop("reduce_factor", 1.0))
    rng = np.random.default_rng([seed, 4242])
    parts = SCHEMES[scheme](labels, num_clients, rng, client_ids=client_ids, **params)
    # a scheme with client groups (multimodal) returns (parts, group label per client)
    parts, groups = parts if isinstance(parts, tuple) else (parts, None)
    train, val, test = local_split(parts, test_fraction, rng, val_fraction)
    train = reduce_clients(train, reduce_fraction, reduce_factor, seed)
    if min(len(t) for t in train) == 0:
        raise ConfigError(f"num_clients: {num_clients} clients leave some with no training data")
    partition = Partition(train, test, groups, val if val_fraction > 0 else None)
    if path is not None:
        _save(path, partition)
    return partition


def class_counts(labels: np.ndarray, partition: Partition, num_classes: int) -> np.ndarray:
    """(num_clients, num_classes) training-sample counts."""
    return np.stack([np.bincount(labels[idx], minlength=num_classes) for idx in partition.train])
