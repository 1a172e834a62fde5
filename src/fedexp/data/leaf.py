"""LEAF datasets' on-disk layouts, and FEMNIST (62 classes, one natural client per writer).

LEAF (Caldas et al., 2018) stores a dataset as JSON files of the form
`{"users": [...], "num_samples": [...], "user_data": {user: {"x": [...], "y": [...]}}}`, under
`data/train/` and `data/test/` after its preprocessing (or `data/all_data/` before the split).
FEMNIST is also read from the Hugging Face parquet layout of `flwrlabs/femnist` (columns
`image`, `writer_id`, `character`), which is what `dataset.download=true` fetches.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import time
from pathlib import Path

import numpy as np
import torch

from fedexp.data import cache_files
from fedexp.data.datasets import Dataset
from fedexp.data.files import check_labels, data_error, one_line
from fedexp.data.pixels import LEAF_RULE, check_pixel_range, decode_image, pixel_problem, to_unit
from fedexp.errors import ConfigError

FEMNIST_CLASSES = 62  # 10 digits, 26 upper-case, 26 lower-case letters (LEAF's label order)
FEMNIST_HF_REPO = "flwrlabs/femnist"
HF_CACHE = "hf_cache"  # under data_dir: what `datasets` downloads before the parquet export
CACHE_VERSION = 3  # arrays cached by an older, less strict reader are parsed again
PROGRESS_BYTES = 32 * 2**20  # a file this large (or several files) gets a progress line each

log = logging.getLogger(__name__)


def leaf_files(root: Path) -> tuple[list[Path], list[Path]]:
    """(train files, test files): root/train/*.json and root/test/*.json, else root/*.json.

    A `*.json` that is not a readable file (a directory, a dangling link, a link loop) is one
    ConfigError naming it.
    """
    if (root / "train").is_dir():
        found = sorted((root / "train").glob("*.json")), sorted((root / "test").glob("*.json"))
    else:
        found = sorted(root.glob("*.json")), []
    for path in (*found[0], *found[1]):
        regular_file(path)
    return found


def regular_file(path: Path) -> Path:
    """path if it is a file one can open; else one ConfigError naming it and why not."""
    try:
        if path.is_file():
            return path
        what = "a directory" if path.is_dir() else "not a regular file"
        path.stat()  # a dangling link or a link loop raises here, naming itself
    except OSError as err:
        what = f"cannot be read ({one_line(err)})"
    raise data_error(path, f"{what}, expected a data file")


def read_json(path: Path) -> object:
    """A JSON file; a truncated, non-JSON or unreadable file is one ConfigError naming it."""
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise data_error(path, f"not JSON ({one_line(err)})") from None
    except OSError as err:
        raise data_error(path, f"cannot be read ({one_line(err)})") from None


def _read_users(blob, path: Path, seen: dict[str, Path], convert_x, num_classes, out) -> None:
    """The users of one parsed LEAF file appended to `out` (x chunks, y, user per sample), in
    file order; `seen` (user -> the file that listed it) refuses a user listed twice."""
    chunks, ys, users = out
    names, counts = blob["users"], blob.get("num_samples")
    if counts is not None and len(counts) != len(names):
        raise data_error(path, f"{len(names)} users but {len(counts)} num_samples")
    for k, user in enumerate(names):
        where = f"{path}: user {user}"
        if str(user) in seen:
            also = "" if seen[str(user)] == path else f" (also in {seen[str(user)]})"
            raise data_error(where, f"listed twice{also}")
        seen[str(user)] = path
        x, y = blob["user_data"][user]["x"], blob["user_data"][user]["y"]
        if not isinstance(x, list) or not isinstance(y, list):
            raise TypeError(f"user {user}: x and y must be lists")
        if len(x) != len(y):
            raise data_error(where, f"{len(x)} samples in x but {len(y)} labels in y")
        if counts is not None and counts[k] != len(y):
            raise data_error(where, f"num_samples says {counts[k]}, x and y hold {len(y)}")
        try:
            chunks.append(convert_x(x))
        except ValueError as err:
            raise data_error(where, str(err)) from None
        ys.extend(check_labels(where, y, num_classes).tolist() if num_classes else y)
        users.extend([str(user)] * len(y))


def read_leaf_json(
    files: list[Path], convert_x=list, num_classes: int | None = None
) -> tuple[list, list, list[str]]:
    """All samples of the given LEAF files, in file/user order: (x chunks, y, user per sample).

    `convert_x` turns one user's x list into a compact chunk as soon as it is read (FEMNIST: a
    float32 array), so a dataset of Python floats never sits in memory at once; a ValueError it
    raises is refused naming the file and the user. A user listed twice (in one file or two),
    x and y of different lengths, a `num_samples` entry that disagrees, and (with
    `num_classes`) a label outside [0, num_classes) are refused too. With several files, or
    one of `PROGRESS_BYTES` or more, each file is announced on the log before it is parsed (a
    full LEAF file takes a while) and a summary line follows.
    """
    chunks: list = []
    ys: list = []
    users: list[str] = []
    seen: dict[str, Path] = {}
    sizes = [regular_file(path).stat().st_size for path in files]
    report = len(files) > 1 or any(size >= PROGRESS_BYTES for size in sizes)
    start = time.perf_counter()
    for number, (path, size) in enumerate(zip(files, sizes), 1):
        if report:
            log.info("reading LEAF JSON %d/%d: %s (%.1f MB)", number, len(files), path, size / 1e6)
        blob = read_json(path)
        try:
            _read_users(blob, path, seen, convert_x, num_classes, (chunks, ys, users))
        except (KeyError, TypeError, AttributeError) as err:
            raise data_error(
                path, f"not LEAF JSON (users/num_samples/user_data/x/y; {err!r})"
            ) from None
        del blob
    if report:
        log.info(
            "read %d LEAF JSON files (%.1f MB): %d users, %d samples in %.1f s",
            len(files),
            sum(sizes) / 1e6,
            len(seen),
            len(ys),
            time.perf_counter() - start,
        )
    return chunks, ys, users


def owner_ids(users: list[str]) -> np.ndarray:
    """Integer client ids (0..U-1, in order of first appearance) for a list of owner names."""
    index: dict[str, int] = {}
    return np.array([index.setdefault(u, len(index)) for u in users], dtype=np.int64)


def _pixels(x: list, pixel_range: tuple[float, float] | None = None) -> np.ndarray:
    """One writer's LEAF x rows -> float32 (n, 784) in [0, 1]; ValueError naming what is wrong.

    JSON numbers have no dtype: LEAF's pixels are in [0, 1] and are kept, anything else is
    refused unless `pixel_range` declares the stored range (`fedexp.data.pixels`)."""
    for i, row in enumerate(x):
        if not isinstance(row, list) or len(row) != 784:
            got = f"{len(row)} values" if isinstance(row, list) else f"a {type(row).__name__}"
            raise ValueError(f"sample {i} has {got}, expected 784 pixels (28x28)")
    try:
        values = np.array(x) if x else np.zeros((0, 784), np.float32)
    except ValueError:
        values = np.array([], dtype=object)
    if values.dtype.kind not in "iuf" or values.ndim != 2:
        raise ValueError("x holds a pixel that is not a number (a null, a string or a list)")
    values = values.astype(np.float64)
    problem = pixel_problem(values, pixel_range, LEAF_RULE, unit="sample")
    if problem is not None:
        raise ValueError(problem)
    if pixel_range is not None:
        lo, hi = pixel_range
        return ((values - lo) / (hi - lo)).astype(np.float32)
    return values.astype(np.float32)


def _femnist_tensors(chunks: list[np.ndarray], y) -> tuple[torch.Tensor, torch.Tensor]:
    images = torch.from_numpy(np.concatenate(chunks) if chunks else np.zeros((0, 784), "f4"))
    labels = torch.as_tensor(np.asarray(y, dtype=np.int64))
    return images.reshape(-1, 1, 28, 28), labels


def read_femnist_parquet(
    files: list[Path], pixel_range: tuple[float, float] | None = None
) -> tuple[list[np.ndarray], list, list[str]]:
    """The HF `flwrlabs/femnist` parquet layout -> ([float images in [0, 1]], labels, writers).

    Images go through the pixel rule of `fedexp.data.pixels` (uint8 PNGs: / 255)."""
    import pyarrow.parquet as pq

    chunks, labels, writers = [], [], []
    for path in files:
        try:
            table = pq.read_table(path, columns=["image", "writer_id", "character"]).to_pydict()
        except Exception as err:  # not parquet, truncated, or without these columns
            raise data_error(path, f"not {FEMNIST_HF_REPO} parquet ({one_line(err)})") from None
        images = []
        for i, img in enumerate(table["image"]):
            pixels = decode_image(img, f"{path}: row {i}", grey=True)
            if pixels.shape != (28, 28):
                size = "x".join(map(str, pixels.shape))
                raise data_error(path, f"row {i}: image of {size}, expected 28x28")
            images.append(to_unit(pixels, f"{path}: row {i}", pixel_range))
        chunks.extend(images)
        labels.extend(check_labels(path, table["character"], FEMNIST_CLASSES).tolist())
        writers.extend(str(w) for w in table["writer_id"])
    if not chunks:
        raise data_error(files[0] if files else "parquet", "no images")
    return [np.stack(chunks).reshape(-1, 784)], labels, writers


def _parquet_files(root: Path) -> list[Path]:
    """*.parquet under root, outside the download cache (whose copies would count twice)."""
    if not root.is_dir():
        return []
    found = (p for p in root.rglob("*.parquet") if HF_CACHE not in p.relative_to(root).parts)
    return sorted(regular_file(p) for p in found)


def _download_femnist(root: Path) -> None:
    """Fetch flwrlabs/femnist with HF `datasets` and store it as parquet under root."""
    try:
        from datasets import load_dataset

        hf = load_dataset(FEMNIST_HF_REPO, split="train", cache_dir=str(root / HF_CACHE))
        (root / "parquet").mkdir(parents=True, exist_ok=True)
        hf.to_parquet(str(root / "parquet" / "train.parquet"))
    except Exception as err:
        raise ConfigError(
            f"dataset.data_dir: FEMNIST download of {FEMNIST_HF_REPO} to {root} failed "
            f"({one_line(err, 400)}); put LEAF's train/ and test/ JSON dirs there"
        ) from None


def _compact(pixels: np.ndarray) -> np.ndarray:
    """uint8 when every value is k/255 (LEAF's and HF's pixels are): a quarter of the disk."""
    levels = np.round(pixels * 255.0)
    return (
        levels.astype(np.uint8) if np.abs(pixels * 255.0 - levels).max(initial=0) < 1e-3 else pixels
    )


def _expand(stored: np.ndarray) -> np.ndarray:
    return stored.astype(np.float32) / 255.0 if stored.dtype == np.uint8 else stored


def _cached(cache_dir: str | None, stamp: list, sources: list[Path], read) -> dict:
    """`read()` once per version of the source files (and `stamp`): parsing LEAF JSON takes
    minutes. The file carries a checksum (`cache_files`); one that fails it, or whose arrays
    do not add up, is logged and parsed again. A folder that cannot be written is logged and
    the run goes on uncached."""
    if cache_dir is None:
        return read()
    stamp = [CACHE_VERSION, *stamp]
    stamp += [(str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns) for p in sources]
    digest = hashlib.sha1(json.dumps(stamp).encode()).hexdigest()[:20]
    path = Path(cache_dir).expanduser() / "femnist" / f"{digest}.npz"
    arrays, problem = cache_files.read(path)
    if arrays is not None:
        problem = _inconsistency(arrays)
        if problem is None:
            return arrays
    if problem is not None:
        log.warning("FEMNIST parse cache %s: %s; parsing the data again", path, problem)
    arrays = read()
    try:
        cache_files.write(path, arrays)
    except OSError as err:
        log.warning("FEMNIST parse cache %s cannot be written (%s); not cached", path, err)
    return arrays


def _inconsistency(arrays: dict[str, np.ndarray]) -> str | None:
    """What does not add up in cached arrays (a file of another layout), or None."""
    splits = (("train", ("train_x", "train_y", "owners")), ("test", ("test_x", "test_y")))
    for split, keys in splits:
        if split == "test" and "test_x" not in arrays and "test_y" not in arrays:
            continue
        if any(k not in arrays for k in keys):
            return f"{split} arrays missing ({', '.join(k for k in keys if k not in arrays)})"
        sizes = {len(arrays[k]) for k in keys}
        if len(sizes) != 1 or arrays[keys[0]].shape[1:] != (1, 28, 28):
            return f"{split} arrays of inconsistent shapes"
    return None


def load_femnist(data_dir: str, download: bool, cache_dir: str | None, pixel_range, **_) -> Dataset:
    """FEMNIST: 28x28 handwritten characters, 62 classes, writer ids as natural clients.

    Reads LEAF JSON (data_dir/{train,test}/*.json, or data_dir/*.json) or else the HF parquet
    layout (any *.parquet under data_dir). Pixels stay in [0, 1] as LEAF stores them (white = 1).
    LEAF's test/ files, when present, are the pooled test set; otherwise the pooled test set is
    the union of the clients' local test splits. The parsed arrays are cached under cache_dir.
    `pixel_range` (null, or [lo, hi]: the stored range, mapped to [0, 1]) is the pixel rule's
    option (`fedexp.data.pixels`): without it LEAF pixels outside [0, 1] are refused.
    """
    pixel_range = check_pixel_range(pixel_range)
    to_pixels = functools.partial(_pixels, pixel_range=pixel_range)
    root = Path(data_dir).expanduser()
    train_files, test_files = leaf_files(root) if root.is_dir() else ([], [])
    parquet = _parquet_files(root)
    if not train_files and not parquet and download:
        _download_femnist(root)
        parquet = _parquet_files(root)

    def read() -> dict[str, np.ndarray]:
        if train_files:
            chunks, y, users = read_leaf_json(train_files, to_pixels, FEMNIST_CLASSES)
        else:
            chunks, y, users = read_femnist_parquet(parquet, pixel_range)
        train_x, train_y = _femnist_tensors(chunks, y)
        arrays = {
            "train_x": _compact(train_x.numpy()),
            "train_y": train_y.numpy(),
            "owners": owner_ids(users),
        }
        if test_files:
            test_chunks, test_y, _users = read_leaf_json(test_files, to_pixels, FEMNIST_CLASSES)
            test_x, test_y = _femnist_tensors(test_chunks, test_y)
            arrays.update(test_x=_compact(test_x.numpy()), test_y=test_y.numpy())
        return arrays

    sources = train_files + test_files if train_files else parquet
    if not sources:
        raise ConfigError(
            f"dataset.data_dir: FEMNIST not found at {root} (expected LEAF train/*.json and "
            f"test/*.json, *.json, or {FEMNIST_HF_REPO} *.parquet); "
            f"set dataset.download=true on a machine with internet"
        )
    arrays = _cached(cache_dir, [pixel_range], sources, read)
    test_x = arrays.get("test_x")
    return Dataset(
        "femnist",
        torch.from_numpy(_expand(arrays["train_x"])),
        torch.from_numpy(arrays["train_y"]),
        torch.from_numpy(_expand(test_x)) if test_x is not None else None,
        torch.from_numpy(arrays["test_y"]) if test_x is not None else None,
        FEMNIST_CLASSES,
        (1, 28, 28),
        train_client_ids=arrays["owners"],
    )
