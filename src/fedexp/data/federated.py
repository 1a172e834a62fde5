"""Client view of a partitioned dataset: clients are index slices into resident tensors."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from fedexp.data.datasets import Dataset
from fedexp.data.partition import Partition
from fedexp.data.split import Split


@dataclass
class FederatedData:
    """A dataset and its partition, with the tensors already on the training device."""

    dataset: Dataset
    partition: Partition
    device: torch.device

    def __post_init__(self) -> None:
        ds = self.dataset
        self.x = ds.train_x.to(self.device)
        self.y = ds.train_y.to(self.device)
        # each split is one flat index tensor on the device (a client is a slice of it) and
        # its offsets on the host: no per-client objects, whatever the number of clients
        part = self.partition
        self._splits = {"train": self._index(part.train), "test": self._index(part.test)}
        # local validation splits; the pooled validation set is their union (from the training
        # pool, never from the test set)
        if part.val is not None:
            self._splits["val"] = self._index(part.val)
        self._owners: dict[str, torch.Tensor] = {}
        self.server_x = ds.server_x.to(self.device) if ds.server_x is not None else None
        self.server_y = ds.server_y.to(self.device) if ds.server_y is not None else None
        # no official test split: the pooled test set is the union of the local test splits,
        # gathered only if something asks for it as tensors (evaluation reads it in place)
        self.test_is_pooled = ds.test_x is None
        self._test_xy = None
        if ds.test_x is not None:
            self._test_xy = (ds.test_x.to(self.device), ds.test_y.to(self.device))

    @property
    def test_x(self) -> torch.Tensor:
        """The pooled test set's inputs."""
        return self._pooled_test()[0]

    @property
    def test_y(self) -> torch.Tensor:
        """The pooled test set's labels."""
        return self._pooled_test()[1]

    def _pooled_test(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self._test_xy is None:
            pooled = self._splits["test"][0]
            self._test_xy = (self.x[pooled], self.y[pooled])
        return self._test_xy

    def _index(self, split: Split) -> tuple[torch.Tensor, np.ndarray]:
        return torch.as_tensor(split.flat, device=self.device), split.offsets

    def _slice(self, split: str, client_id: int) -> torch.Tensor:
        flat, offsets = self._splits[split]
        return flat[offsets[client_id] : offsets[client_id + 1]]

    def split_sizes(self, split: str = "train") -> np.ndarray:
        """Every client's number of samples in `split` ("train", "test" or "val")."""
        return np.diff(self._splits[split][1])

    @property
    def num_clients(self) -> int:
        return self.partition.num_clients

    @property
    def num_classes(self) -> int:
        return self.dataset.num_classes

    @property
    def class_names(self) -> tuple[str, ...] | None:
        """The classes' names where the data name them (`Dataset.class_names`), else None."""
        return self.dataset.class_names

    @property
    def input_shape(self) -> tuple[int, ...]:
        return self.dataset.input_shape

    @property
    def batch_transform(self):
        """Training-time augmentation `(x_batch, generator) -> x_batch`, or None."""
        return self.dataset.batch_transform

    @property
    def groups(self) -> list[str] | None:
        return self.partition.groups

    def num_train(self, client_id: int) -> int:
        offsets = self._splits["train"][1]
        return int(offsets[client_id + 1] - offsets[client_id])

    def train_many(self, client_ids) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
        """The training samples of `client_ids`, client after client (as `train` gives each),
        gathered at once: (x, y, each client's count)."""
        flat = np.asarray(self.partition.train.flat)
        offsets = self._splits["train"][1]
        pos = np.concatenate([flat[offsets[c] : offsets[c + 1]] for c in client_ids])
        idx = torch.as_tensor(pos, device=self.device)
        sizes = [int(offsets[c + 1] - offsets[c]) for c in client_ids]
        return self.x[idx], self.y[idx], sizes

    def train(self, client_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        idx = self._slice("train", client_id)
        return self.x[idx], self.y[idx]

    def test(self, client_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        idx = self._slice("test", client_id)
        return self.x[idx], self.y[idx]

    @property
    def has_val(self) -> bool:
        """Whether the clients have local validation splits (partition.val_fraction > 0)."""
        return "val" in self._splits and len(self._splits["val"][0]) > 0

    def val(self, client_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        idx = self._slice("val", client_id)
        return self.x[idx], self.y[idx]

    def pooled_val(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The server's validation set: the union of the clients' local validation splits."""
        x, y, _ = self.pooled_local("val")
        return x, y

    def pooled_local_test(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Every client's local test split at once: (x, y, owning client of each sample)."""
        return self.pooled_local("test")

    def pooled_local(self, split: str = "test") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Every client's local `split` ("test" or "val") at once: (x, y, owning client)."""
        owner = self.owners(split)
        if split == "test" and self.test_is_pooled:  # the pooled test set is exactly this
            return self.test_x, self.test_y, owner
        idx = self._splits[split][0]
        return self.x[idx], self.y[idx], owner

    def owners(self, split: str = "test") -> torch.Tensor:
        """The owning client of each sample of the pooled `split`, in client order."""
        if split not in self._owners:
            sizes = torch.as_tensor(self.split_sizes(split), device=self.device)
            arange = torch.arange(len(sizes), device=self.device)
            self._owners[split] = torch.repeat_interleave(arange, sizes)
        return self._owners[split]

    def local_index(self, split: str = "test") -> tuple[torch.Tensor, np.ndarray]:
        """The flat indices (into `x`) of every client's local `split` and their offsets."""
        return self._splits[split]

    def local(self, client_id: int, split: str = "test") -> tuple[torch.Tensor, torch.Tensor]:
        """Client `client_id`'s local `split` ("test" or "val")."""
        return self.test(client_id) if split == "test" else self.val(client_id)

    def train_pool(self) -> torch.Tensor:
        """Indices (into `x`) of every client's local training samples, in client order."""
        return self._splits["train"][0]

    def train_labels(self) -> np.ndarray:
        return self.dataset.train_y.numpy()
