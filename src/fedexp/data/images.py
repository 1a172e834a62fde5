"""The image datasets' files: where CIFAR's and MNIST's layouts are under `dataset.data_dir`
(downloaded through torchvision where `dataset.download` allows), the IDX splits read from them,
and their pixels as normalised tensors. The loaders that build a `Dataset` from them are in
`datasets.py`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from fedexp.data.augment import CropFlip
from fedexp.data.files import check_labels, data_error, one_line, read_idx
from fedexp.data.layouts import Layout, missing_error
from fedexp.data.pixels import to_unit
from fedexp.errors import ConfigError

CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)


def images_to_tensor(array: np.ndarray, mean, std, where: str = "images") -> torch.Tensor:
    """uint8 NHWC (or NHW) array -> [0, 1] by the pixel rule -> normalised float NCHW tensor."""
    x = torch.from_numpy(to_unit(np.ascontiguousarray(array), where))
    x = x.unsqueeze(1) if x.ndim == 3 else x.permute(0, 3, 1, 2).contiguous()
    m = torch.tensor(mean).view(1, -1, 1, 1)
    s = torch.tensor(std).view(1, -1, 1, 1)
    return (x - m) / s


DOWNLOAD_CAUSE = 400  # characters of a failed download's cause kept in its one-line error


def _download(what: str, root: Path, fetch: Callable[[], object], layout: str) -> None:
    """Run a torchvision download; a failure is one ConfigError line giving its cause (the
    exception and its message: torchvision's lists each mirror tried and what it answered)."""
    try:
        fetch()
    except Exception as err:
        raise ConfigError(
            f"dataset.data_dir: {what} download to {root} failed "
            f"({one_line(err, DOWNLOAD_CAUSE)}); put {layout} there"
        ) from None


def augmenter(augment: bool, mean, std):
    if not augment:
        return None
    return CropFlip(fill=tuple(-m / s for m, s in zip(mean, std)))  # pad with black pixels


@dataclass(frozen=True)
class CifarLayout:
    """Where a CIFAR variant's pickles are and how to read them."""

    name: str
    title: str  # as messages name it
    folder: str
    train_files: tuple[str, ...]
    test_file: str
    label_key: str
    num_classes: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    archive: str  # the published archive, holding folder/<files>

    @property
    def layout(self) -> Layout:
        files = (*self.train_files, self.test_file)
        return Layout(self.title, self.name, self.folder, files, self.archive)


CIFAR10 = CifarLayout(
    "cifar10",
    "CIFAR-10",
    "cifar-10-batches-py",
    tuple(f"data_batch_{i}" for i in range(1, 6)),
    "test_batch",
    "labels",
    10,
    CIFAR10_MEAN,
    CIFAR10_STD,
    "cifar-10-python.tar.gz",
)
CIFAR100 = CifarLayout(
    "cifar100",
    "CIFAR-100",
    "cifar-100-python",
    ("train",),
    "test",
    "fine_labels",  # the 100 fine classes, not the 20 superclasses
    100,
    (0.5071, 0.4865, 0.4409),
    (0.2673, 0.2564, 0.2762),
    "cifar-100-python.tar.gz",
)
IDX_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
IDX_NAMES = tuple(f for pair in IDX_FILES.values() for f in pair)
MNIST_LIKE = ("MNIST", "FashionMNIST", "KMNIST", "EMNIST", "QMNIST")  # torchvision's folders


def _others_of(folder: str) -> tuple[str, ...]:
    return tuple(f for f in MNIST_LIKE if f != folder)


MNIST_LAYOUT = Layout(
    "MNIST", "mnist", "MNIST/raw", IDX_NAMES, gz=True, not_under=_others_of("MNIST")
)
FMNIST_LAYOUT = Layout(
    "Fashion-MNIST",
    "fmnist",
    "FashionMNIST/raw",
    IDX_NAMES,
    gz=True,
    not_under=_others_of("FashionMNIST"),
)
IMAGE_LAYOUTS = (CIFAR10.layout, CIFAR100.layout, MNIST_LAYOUT, FMNIST_LAYOUT)


def _others(layout: Layout) -> tuple[Layout, ...]:
    return tuple(other for other in IMAGE_LAYOUTS if other.dataset != layout.dataset)


def locate(layout: Layout, root: Path, download: bool, downloader) -> Path:
    """The folder or archive holding the layout's files under root (downloading if allowed)."""
    where = f"the {layout.folder}/ files" + (f" or {layout.archive}" if layout.archive else "")
    source = layout.find(root)
    if source is None and download:
        fetch = lambda: downloader(str(root), train=True, download=True)  # noqa: E731
        _download(layout.title, root, fetch, where)
        source = layout.find(root)
    if source is None:
        hint = f"put {where} there or set dataset.download=true online"
        raise missing_error(layout, root, hint, _others(layout))
    return source


def read_idx_split(images_path: Path, labels_path: Path) -> tuple[np.ndarray, np.ndarray]:
    """(uint8 NHW images, int64 labels in [0, 10)) of one IDX split; the counts must agree."""
    images, labels = read_idx(images_path, 3), read_idx(labels_path, 1)
    if len(images) != len(labels):
        raise data_error(
            images_path, f"{len(images)} images but {labels_path.name} holds {len(labels)} labels"
        )
    return images, check_labels(labels_path, labels, 10)
