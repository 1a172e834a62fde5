"""Writers of small dataset files in their real on-disk layouts (IDX, CIFAR pickles, LEAF JSON),
for the loader tests."""

from __future__ import annotations

import builtins
import gzip
import json
import os
import pickle
import struct
from collections.abc import Callable
from pathlib import Path

import numpy as np


def idx_bytes(array: np.ndarray, dims: tuple[int, ...] | None = None) -> bytes:
    """LeCun's IDX format: magic 0x0000080N (unsigned bytes, N dims), big-endian dims, data.

    `dims` overrides the sizes the header states (default: the array's own shape).
    """
    dims = array.shape if dims is None else dims
    header = struct.pack(">I", 0x0800 | len(dims)) + b"".join(struct.pack(">I", d) for d in dims)
    return header + array.astype(np.uint8).tobytes()


def write_idx(path: Path, array: np.ndarray) -> None:
    """An IDX file, gzipped when the name ends in .gz."""
    data = idx_bytes(array)
    path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)


def write_mnist(root: Path, folder: str, n_train: int = 30, n_test: int = 10, gz: bool = False):
    raw = root / folder / "raw"
    raw.mkdir(parents=True)
    rng = np.random.default_rng(0)
    suffix = ".gz" if gz else ""
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        write_idx(raw / f"{prefix}-images-idx3-ubyte{suffix}", rng.integers(0, 256, (n, 28, 28)))
        write_idx(raw / f"{prefix}-labels-idx1-ubyte{suffix}", np.arange(n) % 10)


def write_cifar100(root: Path, n_train: int = 40, n_test: int = 10) -> None:
    folder = root / "cifar-100-python"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for name, n in (("train", n_train), ("test", n_test)):
        entry = {
            "data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
            "fine_labels": [(7 * i) % 100 for i in range(n)],
            "coarse_labels": [i % 20 for i in range(n)],
        }
        (folder / name).write_bytes(pickle.dumps(entry))
    names = {"fine_label_names": [f"c{i}" for i in range(100)]}
    (folder / "meta").write_bytes(pickle.dumps(names))


def cifar10_batch(n: int, seed: int = 0, byte_keys: bool = False) -> dict:
    """One CIFAR-10 batch as the published files hold it: uint8 rows of 3072, a list of labels."""
    rng = np.random.default_rng(seed)
    entry = {
        "batch_label": "training batch",
        "labels": [i % 10 for i in range(n)],
        "data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
        "filenames": [f"img_{i}.png" for i in range(n)],
    }
    if byte_keys:  # how Python 3 sees the originals when loaded with encoding="bytes"
        entry = {k.encode(): v.encode() if isinstance(v, str) else v for k, v in entry.items()}
        entry[b"filenames"] = [f.encode() for f in entry[b"filenames"]]
    return entry


def write_cifar10(
    root: Path, n_per_batch: int = 6, protocol: int | None = None, byte_keys: bool = False
) -> None:
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    for seed, name in enumerate([f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]):
        entry = cifar10_batch(n_per_batch, seed, byte_keys)
        (folder / name).write_bytes(pickle.dumps(entry, protocol=protocol))


def leaf_blob(users: dict[str, int], seed: int = 0, label_offset: int = 0) -> dict:
    """A LEAF JSON object: 784 floats per sample, user k's labels (5k + i) % 62."""
    rng = np.random.default_rng(seed)
    blob: dict = {"users": [], "num_samples": [], "user_data": {}}
    for k, (user, n) in enumerate(users.items()):
        blob["users"].append(user)
        blob["num_samples"].append(n)
        blob["user_data"][user] = {
            "x": rng.random((n, 784)).round(3).tolist(),
            "y": [(label_offset + k * 5 + i) % 62 for i in range(n)],
        }
    return blob


def write_leaf_femnist(root: Path, writers: dict[str, int], test_per_writer: int = 0) -> None:
    """LEAF JSON: train/ (and test/) files, 784 floats per sample, label = writer index mod 62."""
    (root / "train").mkdir(parents=True)
    blob = leaf_blob(writers)
    (root / "train" / "all_data_0_niid_0_keep_0_train_9.json").write_text(json.dumps(blob))
    if test_per_writer:
        (root / "test").mkdir(parents=True)
        blob = leaf_blob({w: test_per_writer for w in writers}, seed=1)
        (root / "test" / "all_data_0_niid_0_keep_0_test_9.json").write_text(json.dumps(blob))


def sent140_blob(users: dict[str, int]) -> dict:
    """A LEAF Sent140 JSON object: x rows [id, date, query, user, text], y alternating 0/1."""
    blob: dict = {"users": list(users), "num_samples": list(users.values()), "user_data": {}}
    for user, n in users.items():
        rows = [[str(i), "date", "NO_QUERY", user, f"so good {i}"] for i in range(n)]
        blob["user_data"][user] = {"x": rows, "y": [i % 2 for i in range(n)]}
    return blob


MARKER = "payload_ran"  # the file a malicious pickle would create in the data dir


class Payload:
    """Unpickles as the call `func(*args)`: what a malicious `__reduce__` looks like."""

    def __init__(self, func: Callable, args: tuple):
        self.func, self.args = func, args

    def __reduce__(self):
        return self.func, self.args


def system_payload(root: Path) -> Payload:
    return Payload(os.system, (f"touch {root / MARKER}",))


def exec_payload(root: Path) -> Payload:
    return Payload(builtins.exec, (f"open({str(root / MARKER)!r}, 'w').close()",))


def py2_cifar_pickle(data: np.ndarray, labels: list[int]) -> bytes:
    """A CIFAR batch pickled as Python 2 wrote the published files (protocol 2, str as bytes).

    Built opcode by opcode: Python 3 cannot write Python 2 strings, and numpy's array under the
    name `numpy.core.multiarray._reconstruct` with its bytes as a Python 2 str is what the
    published files hold.
    """

    def string(s: bytes) -> bytes:  # BINSTRING: a Python 2 str
        return b"T" + struct.pack("<i", len(s)) + s

    def int4(v: int) -> bytes:  # BININT
        return b"J" + struct.pack("<i", v)

    dtype = (
        b"cnumpy\ndtype\n" + string(b"u1") + int4(0) + int4(1) + b"\x87R"  # TUPLE3 REDUCE
        + b"(" + int4(3) + string(b"|") + b"NNN" + int4(-1) + int4(-1) + int4(0) + b"tb"
    )  # fmt: skip
    array = (
        b"cnumpy.core.multiarray\n_reconstruct\n" + b"cnumpy\nndarray\n" + int4(0) + b"\x85"
        + string(b"b") + b"\x87R" + b"(" + int4(1) + int4(data.shape[0]) + int4(data.shape[1])
        + b"\x86" + dtype + b"\x89" + string(data.astype(np.uint8).tobytes()) + b"tb"
    )  # fmt: skip
    label_list = b"](" + b"".join(int4(v) for v in labels) + b"e"
    return (
        b"\x80\x02}(" + string(b"batch_label") + string(b"training batch 1 of 5")
        + string(b"labels") + label_list + string(b"data") + array + b"u."
    )  # fmt: skip
