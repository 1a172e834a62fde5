"""Cache files of numpy arrays (partitions, parsed LEAF JSON, generated MNIST-1D): written
atomically with a checksum of their content, verified when read.

`write` saves the arrays and a sha256 of the file's name and every array (name, dtype, shape,
bytes) into a temporary file unique to its writer (pid and a random suffix, in the target's
folder), then publishes it with `os.replace`: any number of writers of one file may run at once,
and a reader sees a whole file or none; a directory in the file's place (damage) is replaced.
`read` returns the arrays only when that checksum matches, so a file of the right shapes but
other contents (damaged, edited, or copied from another key), or a directory, is reported as a
miss with its reason, for the caller to log and recompute.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import zipfile
from pathlib import Path

import numpy as np

CHECKSUM = "__sha256__"  # the entry holding the checksum


def checksum(arrays: dict[str, np.ndarray], name: str) -> str:
    """sha256 of the file name and of every array's name, dtype, shape and bytes (sorted)."""
    h = hashlib.sha256(name.encode())
    for key in sorted(arrays):
        array = np.ascontiguousarray(arrays[key])
        h.update(f"|{key}|{array.dtype.str}|{array.shape}|".encode())
        h.update(memoryview(array).cast("B") if array.size else b"")
    return h.hexdigest()


def write(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """Atomically write `arrays` and their checksum to path (an .npz); OSError if it cannot."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(
        dir=path.parent, prefix=f".{path.stem}.{os.getpid()}.", suffix=".tmp"
    )
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays, **{CHECKSUM: np.array(checksum(arrays, path.name))})
        os.chmod(tmp, 0o644)  # mkstemp's 0600 would hide a shared folder's file from others
        if path.is_dir() and not path.is_symlink():  # damage in the file's place: replaced
            shutil.rmtree(path, ignore_errors=True)
        os.replace(tmp, path)
    except BaseException as err:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(err, OSError):  # name the cache file, not the temporary one
            err.filename, err.filename2 = str(path), None
        raise


def read(path: Path) -> tuple[dict[str, np.ndarray] | None, str | None]:
    """(arrays, None) for a file whose checksum matches; (None, why) otherwise.

    A missing file is (None, None): a plain miss, nothing to report.
    """
    if not path.exists():
        return None, None
    if not path.is_file():
        return None, "not a file"
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except (OSError, EOFError, KeyError, ValueError, zipfile.BadZipFile) as err:
        return None, f"unreadable ({type(err).__name__}: {err})".splitlines()[0]
    stored = arrays.pop(CHECKSUM, None)
    if stored is None:
        return None, "no checksum (written by an older version)"
    if str(stored) != checksum(arrays, path.name):
        return None, "checksum mismatch (its contents changed after it was written)"
    return arrays, None
