"""Dataset loaders. Each returns a `Dataset`: whole train/test tensors in memory.

Real files are read with torchvision or scikit-learn; nothing is downloaded unless the dataset
config allows it, and a missing copy gives one `ConfigError` naming the path and files expected.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from fedexp.core.types import ConfigError


@dataclass
class Dataset:
    """A dataset held as tensors.

    `train_client_ids` gives the natural owner (writer, user, generating client) of each training
    sample where the data has one; `test_x`/`test_y` may be None when the data has no separate
    test split (then the pooled test set is the union of the clients' local test splits).
    """

    name: str
    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor | None
    test_y: torch.Tensor | None
    num_classes: int
    input_shape: tuple[int, ...]
    train_client_ids: np.ndarray | None = None
    server_x: torch.Tensor | None = None  # unlabelled server-side pool (see `server_pool`)
    model_kwargs: dict = field(default_factory=dict)  # extra model-factory args (vocab_size...)


def _split_holdout(x, y, fraction: float, seed: int):
    """Stratification-free seeded holdout split of (x, y)."""
    rng = np.random.default_rng([seed, 7919])
    perm = rng.permutation(len(y))
    n_test = int(round(fraction * len(y)))
    test, train = perm[:n_test], perm[n_test:]
    return x[train], y[train], x[test], y[test]


def load_digits(test_fraction: float = 0.2, seed: int = 0, **_) -> Dataset:
    """scikit-learn's bundled 8x8 handwritten digits (1797 images, shipped with the package)."""
    from sklearn.datasets import load_digits as sk_digits

    bunch = sk_digits()
    x = torch.tensor(bunch.images, dtype=torch.float32).unsqueeze(1) / 16.0
    x = (x - 0.3) / 0.4  # roughly zero-mean, unit-variance pixels
    y = torch.tensor(bunch.target, dtype=torch.long)
    tx, ty, vx, vy = _split_holdout(x, y, test_fraction, seed)
    return Dataset("digits", tx, ty, vx, vy, 10, (1, 8, 8))


def load_synthetic(
    alpha: float = 1.0,
    beta: float = 1.0,
    num_clients: int = 30,
    dimension: int = 60,
    num_classes: int = 10,
    iid: bool = False,
    seed: int = 0,
    **_,
) -> Dataset:
    """Synthetic(alpha, beta) of the FedProx paper (Li et al., 2020), generated from the seed.

    Client k: u_k ~ N(0, alpha), W_k, b_k ~ N(u_k, 1); B_k ~ N(0, beta), v_k ~ N(B_k, 1);
    x ~ N(v_k, Sigma) with Sigma_jj = j^-1.2; y = argmax(W_k x + b_k). Client sizes follow the
    reference generator's power law (lognormal(4, 2) + 50). `iid=True` gives Synthetic-IID.
    """
    rng = np.random.default_rng([seed, 1013])
    sizes = rng.lognormal(4, 2, num_clients).astype(int) + 50
    sizes = np.minimum(sizes, 2000)  # keep one client from holding the whole dataset
    sigma = np.array([(j + 1) ** -1.2 for j in range(dimension)])
    w_glob = rng.normal(0, 1, (num_classes, dimension))
    b_glob = rng.normal(0, 1, num_classes)
    xs, ys, owners = [], [], []
    for k, n in enumerate(sizes):
        if iid:
            w, b, v = w_glob, b_glob, np.zeros(dimension)
        else:
            u = rng.normal(0, np.sqrt(alpha))
            w = rng.normal(u, 1, (num_classes, dimension))
            b = rng.normal(u, 1, num_classes)
            v = rng.normal(rng.normal(0, np.sqrt(beta)), 1, dimension)
        x = rng.normal(v, np.sqrt(sigma), (n, dimension))
        xs.append(x)
        ys.append(np.argmax(x @ w.T + b, axis=1))
        owners.append(np.full(n, k))
    x = torch.tensor(np.concatenate(xs), dtype=torch.float32)
    y = torch.tensor(np.concatenate(ys), dtype=torch.long)
    return Dataset("synthetic", x, y, None, None, num_classes, (dimension,), np.concatenate(owners))


CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)


def require_files(data_dir: Path, expected: list[str], what: str, download_hint: str) -> None:
    """Raise one clear ConfigError when any expected file is missing under data_dir."""
    missing = [f for f in expected if not (data_dir / f).exists()]
    if missing:
        raise ConfigError(
            f"dataset.data_dir: {what} not found at {data_dir} (missing {', '.join(missing)}); "
            f"{download_hint}"
        )


def images_to_tensor(array: np.ndarray, mean, std) -> torch.Tensor:
    """uint8 NHWC (or NHW) array -> normalised float NCHW tensor."""
    x = torch.from_numpy(np.ascontiguousarray(array)).float().div_(255.0)
    x = x.unsqueeze(1) if x.ndim == 3 else x.permute(0, 3, 1, 2).contiguous()
    m = torch.tensor(mean).view(1, -1, 1, 1)
    s = torch.tensor(std).view(1, -1, 1, 1)
    return (x - m) / s


def load_cifar10(data_dir: str, download: bool = False, **_) -> Dataset:
    """CIFAR-10 from the python-pickle layout torchvision uses (cifar-10-batches-py/)."""
    from torchvision.datasets import CIFAR10

    root = Path(data_dir).expanduser()
    files = [f"cifar-10-batches-py/data_batch_{i}" for i in range(1, 6)]
    files.append("cifar-10-batches-py/test_batch")
    if download and any(not (root / f).exists() for f in files):
        try:
            CIFAR10(root=str(root), train=True, download=True)
        except Exception as err:  # no network: fall through to the one-line error
            raise ConfigError(
                f"dataset.data_dir: CIFAR-10 download to {root} failed ({type(err).__name__}); "
                f"put the python version (cifar-10-batches-py/) there"
            ) from None
    require_files(
        root,
        files,
        "CIFAR-10",
        "put the python version (cifar-10-batches-py/) there "
        "or set dataset.download=true on a machine with internet",
    )
    train = CIFAR10(root=str(root), train=True, download=False)
    test = CIFAR10(root=str(root), train=False, download=False)
    return Dataset(
        "cifar10",
        images_to_tensor(train.data, CIFAR10_MEAN, CIFAR10_STD),
        torch.tensor(train.targets, dtype=torch.long),
        images_to_tensor(test.data, CIFAR10_MEAN, CIFAR10_STD),
        torch.tensor(test.targets, dtype=torch.long),
        10,
        (3, 32, 32),
    )
