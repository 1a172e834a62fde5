"""Client view of a partitioned dataset: clients are index slices into resident tensors."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from fedexp.data.datasets import Dataset
from fedexp.data.partition import Partition


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
        self._train = [torch.as_tensor(i, device=self.device) for i in self.partition.train]
        self._test = [torch.as_tensor(i, device=self.device) for i in self.partition.test]
        # local validation splits; the pooled validation set is their union (from the training
        # pool, never from the test set)
        self._val = (
            None
            if self.partition.val is None
            else [torch.as_tensor(i, device=self.device) for i in self.partition.val]
        )
        self._pooled: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        self.server_x = ds.server_x.to(self.device) if ds.server_x is not None else None
        if ds.test_x is not None:
            self.test_x, self.test_y = ds.test_x.to(self.device), ds.test_y.to(self.device)
        else:  # no official test split: the pooled test set is the union of local test splits
            pooled = torch.cat(self._test)
            self.test_x, self.test_y = self.x[pooled], self.y[pooled]

    @property
    def num_clients(self) -> int:
        return self.partition.num_clients

    @property
    def num_classes(self) -> int:
        return self.dataset.num_classes

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
        return len(self.partition.train[client_id])

    def train(self, client_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        idx = self._train[client_id]
        return self.x[idx], self.y[idx]

    def test(self, client_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        idx = self._test[client_id]
        return self.x[idx], self.y[idx]

    @property
    def has_val(self) -> bool:
        """Whether the clients have local validation splits (partition.val_fraction > 0)."""
        return self._val is not None and sum(len(v) for v in self._val) > 0

    def val(self, client_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        idx = self._val[client_id]
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
        if split not in self._pooled:
            parts = self._test if split == "test" else self._val
            sizes = torch.tensor([len(t) for t in parts], device=self.device)
            owner = torch.repeat_interleave(torch.arange(len(sizes), device=self.device), sizes)
            self._pooled[split] = (torch.cat(parts).long(), owner)
        idx, owner = self._pooled[split]
        return self.x[idx], self.y[idx], owner

    def local(self, client_id: int, split: str = "test") -> tuple[torch.Tensor, torch.Tensor]:
        """Client `client_id`'s local `split` ("test" or "val")."""
        return self.test(client_id) if split == "test" else self.val(client_id)

    def train_pool(self) -> torch.Tensor:
        """Indices (into `x`) of every client's local training samples, in client order."""
        if not hasattr(self, "_train_pool"):
            self._train_pool = torch.cat(self._train).long()
        return self._train_pool

    def train_labels(self) -> np.ndarray:
        return self.dataset.train_y.numpy()
