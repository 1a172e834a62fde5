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

    def pooled_local_test(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Every client's local test split at once: (x, y, owning client of each sample)."""
        if not hasattr(self, "_pooled_test"):
            sizes = torch.tensor([len(t) for t in self._test], device=self.device)
            owner = torch.repeat_interleave(torch.arange(len(sizes), device=self.device), sizes)
            self._pooled_test = (torch.cat(self._test).long(), owner)
        idx, owner = self._pooled_test
        return self.x[idx], self.y[idx], owner

    def train_labels(self) -> np.ndarray:
        return self.dataset.train_y.numpy()
