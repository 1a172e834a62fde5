"""Partitions: split a labelled training pool into client index sets.

Each scheme is a pure function of (labels, num_clients, rng, options) returning one index array
per client; its options come from `conf/partition/<scheme>.yaml` through the scheme's component
in `fedexp.data.schemes`, which adds the per-client local split and the cache.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedexp.data.class_deal import blind_shards, deal_classes
from fedexp.data.split import Split
from fedexp.errors import ConfigError

# bump when a scheme's output for the same inputs changes: older cached partitions are not reused
PARTITION_VERSION = 2


@dataclass
class Partition:
    """Per-client index sets into the dataset's training pool (lists of arrays are converted
    to `Split`s)."""

    train: Split
    test: Split
    groups: list[str] | None = None
    val: Split | None = None  # local validation splits (None: no validation split)

    def __post_init__(self) -> None:
        self.train = Split.of(self.train)
        self.test = Split.of(self.test)
        self.val = None if self.val is None else Split.of(self.val)

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
    classes_per_client: int,
    exact: bool,
    num_classes: int | None = None,
    **_,
) -> list[np.ndarray]:
    """McMahan et al.'s pathological non-iid split.

    exact=True: every client gets Z *distinct* classes drawn by a random, class-balanced
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
    beta: float,
    min_size: int,
    max_retries: int,
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
    client_ids: np.ndarray | None,
    min_samples: int,
    max_clients: int | None,
    **_,
) -> Split:
    """One client per natural owner (writer, user, generating client), in owner order.

    Owners with fewer than `min_samples` samples are dropped; if more than `max_clients` remain,
    a seeded random subset of that many is kept (LEAF samples users the same way). The YAML
    default `max_clients: ${num_clients}` makes `num_clients=N` pick N of them; fewer owners than
    `num_clients` give a client per owner there is (`natural_clients`), more are refused.
    """
    if client_ids is None:
        raise ConfigError(
            "partition: natural split needs a dataset with client ids (writers, users: femnist, "
            "sent140, synthetic; dataset=hf with dataset.client_key=<the owner column>); use "
            "partition=iid, shards or dirichlet for this dataset"
        )
    owners, counts = np.unique(client_ids, return_counts=True)
    eligible = np.flatnonzero(counts >= min_samples)
    if max_clients is not None and len(eligible) > max_clients:
        eligible = np.sort(rng.choice(eligible, max_clients, replace=False))
    if len(eligible) == 0:
        raise ConfigError(
            f"partition.min_samples: no owner of the {len(owners)} has >= {min_samples} samples"
        )
    if len(eligible) > num_clients:
        raise ConfigError(
            f"num_clients: the natural split has {len(eligible)} clients (owners with >= "
            f"{min_samples} samples, at most partition.max_clients={max_clients}), "
            f"got {num_clients}"
        )
    # group sample indices by owner in one sort (a mask per owner is quadratic for FEMNIST)
    owner = np.searchsorted(owners, client_ids)
    if len(eligible) < len(owners):
        keep = np.zeros(len(owners), dtype=bool)
        keep[eligible] = True
        owner = np.where(keep[owner], owner, len(owners))  # dropped owners sort last
    order = np.argsort(owner, kind="stable")[: counts[eligible].sum()]
    return Split(order, np.concatenate([[0], np.cumsum(counts[eligible])]))


def natural_clients(
    num_clients: int, client_ids: np.ndarray | None, min_samples: int, max_clients: int | None
) -> int:
    """How many clients `natural` makes: `num_clients`, or the eligible owners where fewer."""
    if client_ids is None:
        return num_clients
    counts = np.unique(client_ids, return_counts=True)[1]
    eligible = int((counts >= min_samples).sum())
    if max_clients is not None:
        eligible = min(eligible, max_clients)
    return min(eligible, num_clients)


def _group_classes(
    labels: np.ndarray,
    num_classes: int | None,
    majority_classes: list[int] | None,
    minority_classes: list[int] | None,
) -> tuple[np.ndarray, np.ndarray]:
    """`multimodal`'s (majority classes, minority classes): as given, else the odd and the even
    classes; the two sets must be disjoint."""
    classes = np.arange(num_classes) if num_classes is not None else np.unique(labels)
    major = np.array(
        [c for c in classes if c % 2 == 1] if majority_classes is None else majority_classes
    )
    minor = np.array(
        [c for c in classes if c % 2 == 0] if minority_classes is None else minority_classes
    )
    if set(major.tolist()) & set(minor.tolist()):
        raise ConfigError("partition.majority_classes: must be disjoint from minority_classes")
    return major, minor


def multimodal(
    labels: np.ndarray,
    num_clients: int,
    rng: np.random.Generator,
    classes_per_client: int,
    group_ratio: int,
    majority_classes: list[int] | None,
    minority_classes: list[int] | None,
    samples_per_client: int | None,
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
    major, minor = _group_classes(labels, num_classes, majority_classes, minority_classes)
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


def local_split(
    parts: Split | list[np.ndarray],
    test_fraction: float,
    rng: np.random.Generator,
    val_fraction: float = 0.0,
) -> tuple[Split, Split, Split]:
    """Split each client's indices into local train/validation/test.

    A client with at least two samples keeps at least one test sample (if `test_fraction` > 0);
    one with at least three keeps at least one validation sample too (if `val_fraction` > 0), and
    at least one training sample always. The test split is drawn first, from the same permutation,
    so `val_fraction=0` leaves the train/test split exactly as it was without validation.

    Each client's permutation is drawn in place on its slice of one flat array, in client order
    (the stream of one `rng.permutation` per client); the cuts and the per-client sorting are
    vectorised: one in-place sort of the pool by (kind, client, index), whose keys are built from
    each client's three counts (its test, validation and training samples come in that order
    within its permuted slice). Working memory: the permuted copy and the keys, two int64 a
    sample (the keys become the returned index tables).
    """
    parts = Split.of(parts)
    sizes, offsets = parts.sizes, parts.offsets
    perm = parts.flat.copy()
    for c in range(len(parts)):
        rng.shuffle(perm[offsets[c] : offsets[c + 1]])  # what rng.permutation(part) draws
    n_test = np.rint(test_fraction * sizes).astype(np.int64)
    if test_fraction > 0:
        n_test = np.where(sizes >= 2, np.maximum(1, n_test), n_test)
    n_val = np.rint(val_fraction * sizes).astype(np.int64)
    if val_fraction > 0:
        n_val = np.where(sizes >= 3, np.maximum(1, n_val), n_val)
    n_val = np.maximum(0, np.minimum(n_val, sizes - n_test - 1))
    n_test = np.minimum(n_test, sizes)
    # (3, clients): each kind's samples per client, kinds in order test, validation, train
    counts = np.stack([n_test, n_val, sizes - n_test - n_val])
    num, n = len(parts), max(1, int(perm.max(initial=0)) + 1)
    # a sample's key: (kind * num + client) * n + index; a client's slice holds its test,
    # validation and training samples in that order, so the segment ids repeat in that order
    segment = (np.arange(3)[:, None] * num + np.arange(num)[None, :]).T.ravel()
    key = np.repeat(segment * n, counts.T.ravel())
    key += perm
    del perm
    key.sort()  # each kind's clients in order, each client's indices sorted
    np.remainder(key, n, out=key)  # the indices themselves
    bounds = np.concatenate([[0], np.cumsum(counts.sum(1))])
    test, val, train = (
        Split(key[bounds[k] : bounds[k + 1]], np.concatenate([[0], np.cumsum(counts[k])]))
        for k in range(3)
    )
    return train, val, test


def reduce_clients(train: Split, fraction: float, factor: float, seed: int) -> Split:
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
    return Split.of(out)


COUNT_CHUNK = 1 << 20  # training samples counted at once by class_counts


def class_counts(labels: np.ndarray, partition: Partition, num_classes: int) -> np.ndarray:
    """(num_clients, num_classes) training-sample counts: a bincount of (client, class) cells,
    over about COUNT_CHUNK samples of whole clients at a time (working memory bounded by the
    chunk, not the pool)."""
    train = Split.of(partition.train)
    num, offsets = len(train), train.offsets
    counts = np.zeros(num * num_classes, dtype=np.int64)
    start = 0
    while start < num:
        stop = int(np.searchsorted(offsets, offsets[start] + COUNT_CHUNK, "right")) - 1
        stop = min(max(stop, start + 1), num)
        sizes = np.diff(offsets[start : stop + 1])
        cells = np.repeat(np.arange(start, stop) * num_classes, sizes)
        cells += labels[train.flat[offsets[start] : offsets[stop]]]
        counts[start * num_classes : stop * num_classes] += np.bincount(
            cells - start * num_classes, minlength=(stop - start) * num_classes
        )
        start = stop
    return counts.reshape(num, num_classes)
