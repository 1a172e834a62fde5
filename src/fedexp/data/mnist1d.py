"""MNIST-1D (Greydanus, 2020, "Scaling down deep learning"), generated offline.

The `mnist1d` package draws each sample from one of its ten built-in 1-D digit templates (12
points), padded, dilated, scaled, translated, given correlated and i.i.d. noise, sheared and
resampled to 40 points (`mnist1d.data.make_dataset`). Nothing is downloaded: the package's
`get_dataset` (which fetches a pickle) is never called. Every generator argument but the sample
count and the seed stays at the package's default (`mnist1d.data.get_dataset_args()`).

The generated arrays are cached under `data_dir` (one `.npz` per package version, sample count
and generator seed), written atomically with a checksum of their content (`cache_files`) and
read back without pickle; a file that fails the checksum or does not add up is generated again.
"""

from __future__ import annotations

import logging
import random
import time
from importlib import metadata
from pathlib import Path

import numpy as np
import torch

from fedexp.data import cache_files
from fedexp.data.datasets import Dataset
from fedexp.errors import ConfigError, with_checks

log = logging.getLogger(__name__)

NUM_CLASSES = 10  # the package's ten digit templates
CACHE_VERSION = 2  # bump when the cached arrays change meaning (2: with a checksum)


def check_args(num_samples, test_fraction, generator_seed) -> None:
    """One ConfigError line for values the generator or the split cannot take."""
    least = 10 * NUM_CLASSES
    if not _is_int(num_samples) or num_samples < least or num_samples % NUM_CLASSES:
        raise ConfigError(
            f"dataset.num_samples: must be a multiple of {NUM_CLASSES} and >= {least} (the "
            f"generator draws num_samples/{NUM_CLASSES} samples of each class), got {num_samples!r}"
        )
    if not _is_int(generator_seed) or not 0 <= generator_seed < 2**32:
        raise ConfigError(
            f"dataset.generator_seed: must be an integer in [0, 2**32), got {generator_seed!r}"
        )
    ok = isinstance(test_fraction, int | float) and not isinstance(test_fraction, bool)
    if not ok or not 0 < test_fraction < 1:
        raise ConfigError(f"dataset.test_fraction: must be in (0, 1), got {test_fraction!r}")
    n_train = train_size(num_samples, test_fraction)
    if not 0 < n_train < num_samples:
        raise ConfigError(
            f"dataset.test_fraction: {test_fraction} of {num_samples} samples leaves "
            f"{n_train} for training and {num_samples - n_train} for the test set; both need one"
        )


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def train_size(num_samples: int, test_fraction: float) -> int:
    """The package's split: the first int(n * train_split) samples train, train_split = 1 - f."""
    return int(num_samples * (1 - test_fraction))


def _check_config(cfg) -> None:
    node = cfg.dataset
    check_args(node.num_samples, node.test_fraction, node.generator_seed)


def package_version() -> str:
    try:
        return metadata.version("mnist1d")
    except metadata.PackageNotFoundError:
        raise ConfigError(
            "dataset: mnist1d needs the mnist1d package (pip install mnist1d==0.0.2.post1)"
        ) from None


def generate(num_samples: int, generator_seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(float32 [n, 40] signals, int64 [n] labels) in the generator's shuffled order, unsplit.

    The package seeds and draws from the global `random` and `numpy.random` states; both are
    restored afterwards, so loading the data never shifts a run's other random streams.
    """
    from mnist1d.data import get_dataset_args, make_dataset

    args = get_dataset_args()
    args.num_samples, args.seed, args.train_split = num_samples, generator_seed, 1.0
    np_state, py_state = np.random.get_state(), random.getstate()
    try:
        data = make_dataset(args)
    finally:
        np.random.set_state(np_state)
        random.setstate(py_state)
    return data["x"].astype(np.float32), data["y"].astype(np.int64)


def cache_path(data_dir: str, num_samples: int, generator_seed: int) -> Path:
    name = f"mnist1d-{package_version()}-n{num_samples}-seed{generator_seed}-v{CACHE_VERSION}.npz"
    return Path(data_dir).expanduser() / name


def read_cache(path: Path, num_samples: int) -> tuple[np.ndarray, np.ndarray] | None:
    """The cached arrays, or None when the file is missing, fails its checksum or is
    inconsistent (each but a missing file logged as one line)."""
    arrays, problem = cache_files.read(path)
    if arrays is not None:
        x, y = arrays.get("x"), arrays.get("y")
        problem = "no x or y" if x is None or y is None else _inconsistency(x, y, num_samples)
        if problem is None:
            return x, y
    if problem is not None:
        log.warning("mnist1d: cache %s: %s; generating it again", path, problem)
    return None


def _inconsistency(x: np.ndarray, y: np.ndarray, num_samples: int) -> str | None:
    if x.dtype != np.float32 or x.ndim != 2 or len(x) != num_samples:
        return f"signals {x.dtype}{list(x.shape)}, expected float32[{num_samples}, length]"
    if y.dtype != np.int64 or y.shape != (num_samples,):
        return f"labels {y.dtype}{list(y.shape)}, expected int64[{num_samples}]"
    if len(y) and (y.min() < 0 or y.max() >= NUM_CLASSES):
        return f"labels outside [0, {NUM_CLASSES})"
    if not np.isfinite(x).all():
        return "non-finite signal values"
    return None


def write_cache(path: Path, x: np.ndarray, y: np.ndarray) -> None:
    """Atomically, with a checksum (`cache_files.write`). A folder that cannot be written is
    logged and skipped (the data is still returned)."""
    try:
        cache_files.write(path, {"x": x, "y": y})
    except OSError as err:
        log.warning("mnist1d: cannot write the cache %s (%s); not cached", path, err)


def mnist1d_arrays(
    num_samples: int, generator_seed: int, data_dir: str | None
) -> tuple[np.ndarray, np.ndarray]:
    """The generator's arrays, from the cache under data_dir when it holds them (None: no cache)."""
    path = None if data_dir is None else cache_path(data_dir, num_samples, generator_seed)
    cached = None if path is None else read_cache(path, num_samples)
    if cached is not None:
        log.info("mnist1d: %d samples read from %s", num_samples, path)
        return cached
    start = time.perf_counter()
    x, y = generate(num_samples, generator_seed)
    log.info(
        "mnist1d: %d samples generated (seed %d) in %.1f s",
        num_samples,
        generator_seed,
        time.perf_counter() - start,
    )
    if path is not None:
        write_cache(path, x, y)
    return x, y


@with_checks(config=_check_config)
def load_mnist1d(
    num_samples: int, test_fraction: float, generator_seed: int, data_dir: str | None, **_
) -> Dataset:
    """MNIST-1D: `num_samples` signals of 40 points in 10 balanced classes, from the generator
    seeded by `generator_seed` (not the run's seed: every run shares the data).

    The last `test_fraction` of the generator's shuffled order is the pooled test set (the
    package's own train/test split). Values are kept as generated: the package standardises
    all samples together (train and test) to mean 0, std 1.
    """
    check_args(num_samples, test_fraction, generator_seed)
    x, y = mnist1d_arrays(num_samples, generator_seed, data_dir)
    n_train = train_size(num_samples, test_fraction)
    return Dataset(
        "mnist1d",
        torch.from_numpy(x[:n_train]),
        torch.from_numpy(y[:n_train]),
        torch.from_numpy(x[n_train:]),
        torch.from_numpy(y[n_train:]),
        NUM_CLASSES,
        (x.shape[1],),
    )
