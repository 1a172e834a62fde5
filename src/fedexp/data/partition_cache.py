"""The on-disk cache of partitions: atomic writes with a checksum of the content (see
`cache_files`), and reads that treat a damaged, edited or inconsistent file (or a directory in
its place) as a miss (logged); the partition is then computed and the file written again."""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import numpy as np

from fedexp.data import cache_files
from fedexp.data.partition import Partition
from fedexp.data.split import Split

log = logging.getLogger(__name__)


def _pack(split) -> tuple[np.ndarray, np.ndarray]:
    split = Split.of(split)
    return split.flat, split.offsets


def digest(values: np.ndarray) -> str:
    """sha1 of an array's dtype, shape and contents (text of the values for object arrays)."""
    arr = np.asarray(values)
    h = hashlib.sha1(f"{arr.dtype.str}{arr.shape}".encode())
    if arr.dtype == object:
        h.update(json.dumps(arr.tolist(), default=str).encode())
    else:
        h.update(np.ascontiguousarray(arr).tobytes())
    return h.hexdigest()


def save(path: Path, partition: Partition) -> None:
    """Write atomically, with a checksum (`cache_files.write`); a cache that cannot be written
    (a full disk, a folder without write permission) is logged and skipped: the partition is
    computed, the run goes on uncached.

    Concurrent writers of one key each write their own temporary file; the last replace wins
    and every reader sees a complete file.
    """
    tr, tr_off = _pack(partition.train)
    te, te_off = _pack(partition.test)
    arrays = {"train": tr, "train_off": tr_off, "test": te, "test_off": te_off}
    if partition.groups is not None:
        arrays["groups"] = np.array(partition.groups)
    if partition.val is not None:
        arrays["val"], arrays["val_off"] = _pack(partition.val)
    try:
        cache_files.write(path, arrays)
    except OSError as err:
        log.warning("partition cache %s cannot be written (%s); not cached", path, err.strerror)


def load(path: Path, num_clients: int, n: int) -> Partition | None:
    """The cached partition, or None if the file is missing, fails its checksum or is
    inconsistent with the pool (each but a missing file logged as one line)."""
    arrays, problem = cache_files.read(path)
    partition = None
    if arrays is not None:
        try:
            partition = _unpack(arrays, num_clients, n)
        except (KeyError, ValueError) as err:
            problem = str(err)
    if problem is not None:
        log.warning("partition cache %s: %s; recomputing it", path, problem)
    return partition


def _unpack(z: dict[str, np.ndarray], num_clients: int, n: int) -> Partition:
    def unpack(v: np.ndarray, off: np.ndarray) -> Split:
        valid = (
            v.ndim == off.ndim == 1
            and len(off) == num_clients + 1
            and off[0] == 0
            and off[-1] == len(v)
            and bool(np.all(np.diff(off) >= 0))
            and (len(v) == 0 or (v.min() >= 0 and v.max() < n))
        )
        if not valid:
            raise ValueError(f"not a partition of {n} samples over {num_clients} clients")
        return Split(v, off)

    train = unpack(z["train"], z["train_off"])
    test = unpack(z["test"], z["test_off"])
    groups = z["groups"].tolist() if "groups" in z else None
    val = unpack(z["val"], z["val_off"]) if "val" in z else None
    if groups is not None and len(groups) != num_clients:
        raise ValueError(f"{len(groups)} client groups for {num_clients} clients")
    return Partition(train, test, groups, val)
