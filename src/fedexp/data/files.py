"""Strict readers of the on-disk formats: python pickles (CIFAR), IDX files (MNIST), label arrays.

A file that does not add up (truncated, the wrong type, counts that differ, labels outside the
dataset's classes) is refused with one `ConfigError` line `dataset.data_dir: <file>: <problem>`
before anything trains. Pickles are read with `SafeUnpickler`, which can build numpy arrays and
the plain containers and nothing else: loading a dataset never runs code from the file.
"""

from __future__ import annotations

import codecs
import contextlib
import gzip
import io
import math
import pickle
import zlib
from collections.abc import Iterator
from contextvars import ContextVar
from pathlib import Path
from typing import Any

import numpy as np

from fedexp.errors import ConfigError

# the key a data error names: the option that told the loader where the data are
# (`dataset.data_dir`; `dataset=hf` reading a file or directory given as `dataset.path`: that)
_DATA_KEY: ContextVar[str] = ContextVar("fedexp_data_key", default="dataset.data_dir")


@contextlib.contextmanager
def data_key(key: str) -> Iterator[None]:
    """Within the block, `data_error` names `key` (the option the user set) instead of
    `dataset.data_dir`."""
    token = _DATA_KEY.set(key)
    try:
        yield
    finally:
        _DATA_KEY.reset(token)


def data_error(where: Path | str, problem: str) -> ConfigError:
    """`dataset.data_dir: <where>: <problem>` (where: a file, or a file and the user in it;
    the key is the one `data_key` set, if any)."""
    return ConfigError(f"{_DATA_KEY.get()}: {where}: {problem}")


def one_line(err: BaseException, limit: int = 160) -> str:
    """An exception as `Type: message` on one line, its message cut at `limit` characters."""
    text = " ".join(str(err).split())
    text = text if len(text) <= limit else text[: limit - 3] + "..."
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


def _latin1_encode(text: str, encoding: str = "latin1") -> bytes:
    """`_codecs.encode` as protocol-2 pickles use it for bytes; no other codec is reachable."""
    if encoding.replace("-", "").replace("_", "").lower() != "latin1":
        raise pickle.UnpicklingError(f"refuses to unpickle _codecs.encode(..., {encoding!r})")
    return codecs.encode(text, "latin1")


def _numpy_globals() -> dict[tuple[str, str], Any]:
    """What numpy's own pickles name, under numpy 1 (`numpy.core`) and 2 (`numpy._core`)."""
    try:
        from numpy._core import multiarray, numeric
    except ImportError:  # numpy 1.x
        from numpy.core import multiarray, numeric
    found: dict[tuple[str, str], Any] = {
        ("numpy", "ndarray"): np.ndarray,
        ("numpy", "dtype"): np.dtype,
    }
    for package in ("numpy.core", "numpy._core"):
        found[(f"{package}.multiarray", "_reconstruct")] = multiarray._reconstruct
        found[(f"{package}.multiarray", "scalar")] = multiarray.scalar  # numpy scalars
        found[(f"{package}.numeric", "_frombuffer")] = numeric._frombuffer  # protocol 5
    found[("_codecs", "encode")] = _latin1_encode
    return found


class RefusedGlobal(pickle.UnpicklingError):
    """A pickle names a class or function outside `SafeUnpickler.ALLOWED`."""


class SafeUnpickler(pickle.Unpickler):
    """An unpickler that builds numpy arrays, dicts, lists, strings, bytes and numbers only.

    The published CIFAR pickles (Python 2, protocol 2) and re-pickled copies (Python 3, any
    protocol) name nothing else; a pickle naming any other global (`os.system`, `builtins.exec`,
    ...) is refused before that global is even imported.
    """

    ALLOWED = _numpy_globals()

    def find_class(self, module: str, name: str) -> Any:
        try:
            return self.ALLOWED[(module, name)]
        except KeyError:
            raise RefusedGlobal(f"refuses to unpickle {module}.{name}") from None


def load_pickle(path: Path | str, data: bytes | None = None) -> Any:
    """The object in a pickle file, read by `SafeUnpickler` (Python 2 strings as latin-1).

    Args:
        path: the file, or (with `data`) how messages name the bytes (`archive: member`).
        data: the pickle's bytes when they come from somewhere else than `path` (an archive).
    """
    try:
        if data is not None:
            return SafeUnpickler(io.BytesIO(data), encoding="latin1").load()
        with open(path, "rb") as fh:
            return SafeUnpickler(fh, encoding="latin1").load()
    except RefusedGlobal as err:
        raise data_error(
            path, f"{err} (a dataset pickle may hold numpy arrays, lists, dicts, strings, numbers)"
        ) from None
    except Exception as err:  # anything else: the bytes are not one complete, sane pickle
        raise data_error(path, f"not a readable pickle ({one_line(err)})") from None


def check_labels(where: Path | str, values: Any, num_classes: int) -> np.ndarray:
    """A flat list/array of integer labels in [0, num_classes), as int64; refused otherwise."""
    try:
        labels = np.asarray(values) if isinstance(values, list | tuple | np.ndarray) else None
    except ValueError:  # ragged nesting
        labels = None
    # integral floats (1.0, as some JSON writers store labels) are integers
    if (
        labels is not None
        and labels.dtype.kind == "f"
        and np.isfinite(labels).all()
        and (labels == np.round(labels)).all()
    ):
        labels = labels.astype(np.int64)
    if labels is None or labels.ndim != 1 or (labels.size and labels.dtype.kind not in "iu"):
        got = type(values).__name__ if labels is None else f"{labels.dtype} of shape {labels.shape}"
        raise data_error(where, f"labels must be a flat list of integers, got {got}")
    labels = labels.astype(np.int64)
    bad = np.flatnonzero((labels < 0) | (labels >= num_classes))
    if bad.size:
        more = f", and {bad.size - 1} more" if bad.size > 1 else ""
        raise data_error(
            where, f"label {labels[bad[0]]} outside [0, {num_classes}) (sample {bad[0]}{more})"
        )
    return labels


CIFAR_PIXELS = 3 * 32 * 32


def read_cifar_batch(
    path: Path | str, label_key: str, num_classes: int, data: bytes | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """One CIFAR python-pickle batch -> (uint8 NHWC images, int64 labels), strictly checked.

    Keys may be str (latin-1 loading, or files re-pickled under Python 3) or bytes (copies
    re-pickled after loading with encoding="bytes"). With `data`, the batch is those bytes (a
    member of an archive) and `path` only names it in messages.
    """
    entry = load_pickle(path, data)
    expected = f"a dict with 'data' and {label_key!r}"
    if not isinstance(entry, dict):
        raise data_error(path, f"not a CIFAR batch (a {type(entry).__name__}, expected {expected})")
    entry = {k.decode("latin1") if isinstance(k, bytes) else k: v for k, v in entry.items()}
    missing = [k for k in ("data", label_key) if k not in entry]
    if missing:
        keys = ", ".join(sorted(map(repr, entry))[:6])
        raise data_error(path, f"not a CIFAR batch (no {missing[0]!r}; keys: {keys})")
    data = entry["data"]
    if not (
        isinstance(data, np.ndarray)
        and data.dtype == np.uint8
        and data.ndim == 2
        and data.shape[1] == CIFAR_PIXELS
    ):
        got = (
            f"{data.dtype} array of shape {data.shape}"
            if isinstance(data, np.ndarray)
            else f"a {type(data).__name__}"
        )
        raise data_error(path, f"'data' must be uint8 rows of {CIFAR_PIXELS} pixels, got {got}")
    labels = check_labels(f"{path}: {label_key!r}", entry[label_key], num_classes)
    if len(labels) != len(data):
        raise data_error(path, f"{len(data)} images but {len(labels)} labels")
    return data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1), labels


def read_idx(path: Path, ndim: int) -> np.ndarray:
    """An IDX file of unsigned bytes with `ndim` dimensions (plain or .gz), as LeCun's MNIST.

    The header's sizes must account for every byte of the file.
    """
    data = path.read_bytes()
    if path.suffix == ".gz":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as err:
            raise data_error(path, f"not a complete gzip file ({one_line(err)})") from None
    if len(data) < 4:
        raise data_error(path, f"{len(data)} bytes, too short for an IDX header")
    magic = int.from_bytes(data[:4], "big")
    if magic >> 8 != 0x08:  # 0x08: unsigned byte; the dimension count is the low byte
        raise data_error(
            path, f"not an unsigned-byte IDX file (magic 0x{magic:08x}, expected 0x0000080{ndim})"
        )
    what = "images" if ndim == 3 else "labels"
    if magic & 0xFF != ndim:
        raise data_error(path, f"IDX of {magic & 0xFF} dimensions, expected {ndim} ({what})")
    offset = 4 + 4 * ndim
    if len(data) < offset:
        raise data_error(path, f"truncated IDX header ({len(data)} of {offset} bytes)")
    dims = [int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]
    if len(data) - offset != math.prod(dims):
        shape = "x".join(map(str, dims))
        raise data_error(
            path,
            f"the header says {shape} ({math.prod(dims)} bytes of {what}), the file holds "
            f"{len(data) - offset} (truncated or corrupt)",
        )
    return np.frombuffer(data, dtype=np.uint8, offset=offset).reshape(dims).copy()
