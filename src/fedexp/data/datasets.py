"""Dataset loaders. Each returns a `Dataset`: whole train/test tensors in memory.

Files are read in the on-disk layouts torchvision downloads (IDX for MNIST/Fashion-MNIST, python
pickles for CIFAR) by the strict readers of `files.py` (pickles through an unpickler that cannot
run code); torchvision is used to download only, because its loaders check the files' md5 sums.
`layouts.py` finds the files (the torchvision root, the folder itself, or CIFAR's published
archive, read in place). Nothing is downloaded unless `dataset.download` allows it, and a missing
copy gives one `ConfigError` naming the files expected and what is nearby (`images.py`: the
image datasets' layouts, their download and their pixels as tensors). FEMNIST and Sentiment140
live in `leaf.py` and `text.py`.
"""

from __future__ import annotations

import functools
import gzip
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedexp.data.files import data_error, read_cifar_batch
from fedexp.data.images import (
    CIFAR10,
    CIFAR10_MEAN,
    CIFAR10_STD,
    CIFAR100,
    FMNIST_LAYOUT,
    IDX_FILES,
    MNIST_LAYOUT,
    CifarLayout,
    augmenter,
    images_to_tensor,
    locate,
    read_idx_split,
)
from fedexp.data.layouts import Layout, read_archive
from fedexp.data.pixels import to_unit

# the image files' names, importable from here as before `images.py` held them
__all__ = ["CIFAR10", "CIFAR10_MEAN", "CIFAR10_STD", "CIFAR100", "Dataset", "digits_arrays"]
__all__ += ["images_to_tensor", "load_cifar10", "load_cifar100", "load_digits", "load_fmnist"]
__all__ += ["load_mnist", "load_synthetic", "locate", "read_idx_split"]


@dataclass
class Dataset:
    """A dataset held as tensors.

    `train_client_ids` gives the natural owner (writer, user, generating client) of each training
    sample where the data has one; `test_x`/`test_y` may be None when the data has no separate
    test split (then the pooled test set is the union of the clients' local test splits).
    `class_names` names the classes where the data does (`class_names[i]` is class i: a
    ClassLabel's names, a CSV's label strings); the partition report shows them.
    """

    name: str
    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor | None
    test_y: torch.Tensor | None
    num_classes: int
    input_shape: tuple[int, ...]
    train_client_ids: np.ndarray | None = None
    server_x: torch.Tensor | None = None  # the server pool's inputs (`partition.server_pool`)
    server_y: torch.Tensor | None = None  # its labels (FLTrust's root dataset; FedHeNN reads none)
    model_kwargs: dict = field(default_factory=dict)  # extra model-factory args (vocab_size...)
    # training-time augmentation of one batch, drawn from the client's generator (see augment.py)
    batch_transform: Callable[[torch.Tensor, torch.Generator], torch.Tensor] | None = None
    # preprocessing fitted after partitioning, on the clients' local training samples only (a
    # text vocabulary): `prepare(dataset, partition) -> dataset`, called once by `fedexp.run`
    prepare: Callable[[Dataset, Any], Dataset] | None = None
    class_names: tuple[str, ...] | None = None  # one per class, where the data name them

    def __post_init__(self) -> None:
        """Every input has a label, every label is one of the `num_classes` classes, and every
        float input is finite (whatever the loader, nothing non-finite reaches training)."""
        for split, x, y in (
            ("training", self.train_x, self.train_y),
            ("test", self.test_x, self.test_y),
        ):
            row = None if x is None else first_nonfinite_row(x)
            if row is not None:
                raise data_error(self.name, f"{split} input {row} holds a non-finite value")
            if y is None:
                continue
            if len(x) != len(y):
                raise data_error(self.name, f"{len(x)} {split} inputs but {len(y)} labels")
            if len(y) and (y.min() < 0 or y.max() >= self.num_classes):
                bad = y[(y < 0) | (y >= self.num_classes)][0].item()
                raise data_error(self.name, f"{split} label {bad} outside [0, {self.num_classes})")
        owners = self.train_client_ids
        if owners is not None and len(owners) != len(self.train_y):
            raise data_error(
                self.name, f"{len(owners)} client ids for {len(self.train_y)} training samples"
            )
        if self.class_names is not None:
            self.class_names = tuple(str(c) for c in self.class_names)
            if len(self.class_names) != self.num_classes:
                raise data_error(
                    self.name,
                    f"{len(self.class_names)} class names for {self.num_classes} classes",
                )


# elements of a float input checked for finiteness at once (`first_nonfinite_row`)
FINITE_CHECK_ELEMENTS = 1 << 22


def first_nonfinite_row(x: torch.Tensor) -> int | None:
    """The first row of float input `x` holding a NaN or an infinity, None if every value is
    finite (or `x` is not floating point).

    Checked a block of about FINITE_CHECK_ELEMENTS values at a time (a few tens of MB at most):
    `torch.isfinite` of the whole tensor holds |x| and masks as large as the data at once (about
    seven bytes a float32 value, over 10 GB at 100 000 synthetic clients), and the check runs on
    every Dataset built.
    """
    if not x.is_floating_point() or len(x) == 0:
        return None
    step = max(1, FINITE_CHECK_ELEMENTS // max(x[0].numel(), 1))
    for start in range(0, len(x), step):
        block = x[start : start + step].reshape(min(step, len(x) - start), -1)
        finite = torch.isfinite(block)
        if not bool(finite.all()):
            return start + int(torch.nonzero(~finite)[0, 0])
    return None


def _split_holdout(x, y, fraction: float, seed: int):
    """Stratification-free seeded holdout split of (x, y)."""
    rng = np.random.default_rng([seed, 7919])
    perm = rng.permutation(len(y))
    n_test = int(round(fraction * len(y)))
    test, train = perm[:n_test], perm[n_test:]
    return x[train], y[train], x[test], y[test]


def digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """(images (1797, 8, 8) float64, labels (1797,) int): scikit-learn's bundled digits, read
    from the file scikit-learn ships (`sklearn/datasets/data/digits.csv.gz`: 64 pixels and the
    label a row) the way `sklearn.datasets.load_digits` reads it, without importing
    `sklearn.datasets` (seconds of start-up); that loader where the file is not found."""
    spec = importlib.util.find_spec("sklearn")  # finds the package without importing it
    origin = spec.origin if spec is not None else None
    path = Path(origin).parent / "datasets" / "data" / "digits.csv.gz" if origin else None
    if path is None or not path.is_file():
        # here for start-up time: sklearn.datasets is imported only without the file
        from sklearn.datasets import load_digits as sk_digits

        bunch = sk_digits()
        return bunch.images, bunch.target
    images, labels = _read_digits(path)
    return images.copy(), labels.copy()


@functools.cache
def _read_digits(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """The digits file parsed, once a process (a sweep's jobs, an experiment built again)."""
    with gzip.open(path, mode="rt", encoding="utf-8") as file:
        data = np.loadtxt(file, delimiter=",")
    return data[:, :-1].reshape(-1, 8, 8), data[:, -1].astype(int, copy=False)


def load_digits(test_fraction: float, seed: int = 0, **_) -> Dataset:
    """scikit-learn's bundled 8x8 handwritten digits (1797 images, shipped with the package)."""
    images, labels = digits_arrays()
    # the pixel rule with the set's own documented range, 0..16 (`fedexp.data.pixels`)
    x = torch.from_numpy(to_unit(images, "sklearn digits", (0.0, 16.0))).unsqueeze(1)
    x = (x - 0.3) / 0.4  # roughly zero-mean, unit-variance pixels
    y = torch.tensor(labels, dtype=torch.long)
    tx, ty, vx, vy = _split_holdout(x, y, test_fraction, seed)
    return Dataset("digits", tx, ty, vx, vy, 10, (1, 8, 8))


SYNTHETIC_CHUNK = 1 << 20  # samples drawn at once by load_synthetic


def load_synthetic(
    alpha: float,
    beta: float,
    dimension: int,
    num_classes: int,
    iid: bool,
    num_clients: int = 30,
    seed: int = 0,
    **_,
) -> Dataset:
    """Synthetic(alpha, beta) of the FedProx paper (Li et al., 2020), generated from the seed.

    Client k: u_k ~ N(0, alpha), W_k, b_k ~ N(u_k, 1); B_k ~ N(0, beta), v_k ~ N(B_k, 1);
    x ~ N(v_k, Sigma) with Sigma_jj = j^-1.2; y = argmax(W_k x + b_k). Client sizes follow the
    reference generator's power law (lognormal(4, 2) + 50). `iid=True` gives Synthetic-IID.

    Drawn in chunks of clients straight into one float32 tensor (no float64 or per-client
    copies): peak memory is the data plus one chunk.
    """
    rng = np.random.default_rng([seed, 1013])
    sizes = rng.lognormal(4, 2, num_clients).astype(int) + 50
    sizes = np.minimum(sizes, 2000)  # keep one client from holding the whole dataset
    scale = (np.arange(1, dimension + 1) ** -0.6).astype(np.float32)  # sqrt(Sigma_jj)
    w_glob = rng.normal(0, 1, (num_classes, dimension))
    b_glob = rng.normal(0, 1, num_classes)
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    x = torch.empty(int(offsets[-1]), dimension)  # float32, filled in place chunk by chunk
    y = torch.empty(int(offsets[-1]), dtype=torch.long)
    xs, ys = x.numpy(), y.numpy()
    start = 0
    while start < num_clients:  # chunks of about SYNTHETIC_CHUNK samples, drawn at once
        stop = int(np.searchsorted(offsets, offsets[start] + SYNTHETIC_CHUNK, "right"))
        stop = min(max(stop - 1, start + 1), num_clients)
        count = stop - start
        if iid:
            w = np.broadcast_to(w_glob, (count, num_classes, dimension))
            b = np.broadcast_to(b_glob, (count, num_classes))
            v = np.zeros((count, dimension))
        else:
            u = rng.normal(0, np.sqrt(alpha), count)
            w = rng.normal(u[:, None, None], 1, (count, num_classes, dimension))
            b = rng.normal(u[:, None], 1, (count, num_classes))
            v = rng.normal(rng.normal(0, np.sqrt(beta), count)[:, None], 1, (count, dimension))
        lo, hi = offsets[start], offsets[stop]
        chunk = xs[lo:hi]
        rng.standard_normal(out=chunk, dtype=np.float32)
        chunk *= scale
        v, w, b = v.astype(np.float32), w.astype(np.float32), b.astype(np.float32)
        for k in range(count):  # each client's mean, then one small matmul: its own (W_k, b_k)
            a, e = offsets[start + k] - lo, offsets[start + k + 1] - lo
            chunk[a:e] += v[k]  # in place: no chunk-sized copy of the means (np.repeat)
            ys[lo + a : lo + e] = np.argmax(chunk[a:e] @ w[k].T + b[k], axis=1)
        start = stop
    owners = np.repeat(np.arange(num_clients), sizes)
    return Dataset("synthetic", x, y, None, None, num_classes, (dimension,), owners)


def _load_cifar(
    spec: CifarLayout, data_dir: str, download: bool, downloader, augment: bool
) -> Dataset:
    root = Path(data_dir).expanduser()
    source = locate(spec.layout, root, download, downloader)
    if source.is_dir():
        batches = [
            read_cifar_batch(source / f, spec.label_key, spec.num_classes)
            for f in spec.layout.files
        ]
    else:  # the published archive, read in place
        members = read_archive(source, spec.layout)
        batches = [
            read_cifar_batch(f"{source}: {spec.folder}/{f}", spec.label_key, spec.num_classes, data)
            for f, data in ((f, members[f]) for f in spec.layout.files)
        ]
    train, test = batches[:-1], batches[-1]
    tx, ty = np.concatenate([b[0] for b in train]), np.concatenate([b[1] for b in train])
    vx, vy = test
    return Dataset(
        spec.name,
        images_to_tensor(tx, spec.mean, spec.std),
        torch.from_numpy(ty),
        images_to_tensor(vx, spec.mean, spec.std),
        torch.from_numpy(vy),
        spec.num_classes,
        (3, 32, 32),
        batch_transform=augmenter(augment, spec.mean, spec.std),
    )


def load_cifar10(data_dir: str, download: bool, augment: bool, **_) -> Dataset:
    """CIFAR-10 from the python-pickle layout torchvision uses (cifar-10-batches-py/)."""
    from torchvision.datasets import CIFAR10 as Downloader

    return _load_cifar(CIFAR10, data_dir, download, Downloader, augment)


def load_cifar100(data_dir: str, download: bool, augment: bool, **_) -> Dataset:
    """CIFAR-100 (100 fine labels) from the python-pickle layout (cifar-100-python/{train,test})."""
    from torchvision.datasets import CIFAR100 as Downloader

    return _load_cifar(CIFAR100, data_dir, download, Downloader, augment)


def _load_idx_dataset(layout: Layout, data_dir: str, download: bool, downloader, mean, std):
    """MNIST-style data: <data_dir>/<folder>/raw/{train,t10k}-{images-idx3,labels-idx1}-ubyte."""
    raw = locate(layout, Path(data_dir).expanduser(), download, downloader)

    def path(f: str) -> Path:
        return layout.file(raw, f)

    split = {k: read_idx_split(path(img), path(lab)) for k, (img, lab) in IDX_FILES.items()}
    train_size, test_size = ("x".join(map(str, split[k][0].shape[1:])) for k in IDX_FILES)
    if test_size != train_size:
        raise data_error(
            path(IDX_FILES["test"][0]),
            f"images of {test_size}, the training images are {train_size}",
        )
    return Dataset(
        layout.dataset,
        images_to_tensor(split["train"][0], mean, std),
        torch.from_numpy(split["train"][1]),
        images_to_tensor(split["test"][0], mean, std),
        torch.from_numpy(split["test"][1]),
        10,
        (1, *split["train"][0].shape[1:]),
    )


def load_mnist(data_dir: str, download: bool, **_) -> Dataset:
    """MNIST (torchvision layout MNIST/raw/), normalised with the usual mean 0.1307, std 0.3081."""
    from torchvision.datasets import MNIST

    return _load_idx_dataset(MNIST_LAYOUT, data_dir, download, MNIST, (0.1307,), (0.3081,))


def load_fmnist(data_dir: str, download: bool, **_) -> Dataset:
    """Fashion-MNIST (torchvision layout FashionMNIST/raw/), mean 0.2860, std 0.3530."""
    from torchvision.datasets import FashionMNIST

    return _load_idx_dataset(FMNIST_LAYOUT, data_dir, download, FashionMNIST, (0.2860,), (0.3530,))
