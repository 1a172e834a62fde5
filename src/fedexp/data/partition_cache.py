"""The on-disk cache of partitions: atomic writes, and reads that treat a damaged file as a miss."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from fedexp.data.split import Split

if TYPE_CHECKING:
    from fedexp.data.partition import Partition


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
    """Write atomically: a unique temporary file in the same folder, then `os.replace`.

    Concurrent writers of one key each write their own temporary file; the last replace wins
    and every reader sees a complete file.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tr, tr_off = _pack(partition.train)
    te, te_off = _pack(partition.test)
    extra = {} if partition.groups is None else {"groups": np.array(partition.groups)}
    if partition.val is not None:
        extra["val"], extra["val_off"] = _pack(partition.val)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, train=tr, train_off=tr_off, test=te, test_off=te_off, **extra)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load(path: Path, num_clients: int, n: int) -> Partition | None:
    """The cached partition, or None if the file is missing, truncated or inconsistent."""

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
            raise ValueError(f"inconsistent partition cache {path}")
        return Split(v, off)

    try:
        with np.load(path) as z:
            train = unpack(z["train"], z["train_off"])
            test = unpack(z["test"], z["test_off"])
            groups = z["groups"].tolist() if "groups" in z.files else None
            val = unpack(z["val"], z["val_off"]) if "val" in z.files else None
    except (OSError, EOFError, KeyError, ValueError, zipfile.BadZipFile):
        return None
    if groups is not None and len(groups) != num_clients:
        return None
    from fedexp.data.partition import Partition

    return Partition(train, test, groups, val)
