"""Label flipping (data poisoning): malicious clients train on labels y -> C - 1 - y."""

from __future__ import annotations

import torch

from fedexp.attacks import Attack


class PoisonedData:
    """A view of FederatedData whose malicious clients see flipped training labels; everything
    else (test splits, the pooled test set) is the real data."""

    def __init__(self, data, malicious: frozenset[int]):
        self._data = data
        self._malicious = malicious

    def __getattr__(self, name: str):
        return getattr(self._data, name)

    def train(self, client_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = self._data.train(client_id)
        if client_id in self._malicious:
            y = self._data.num_classes - 1 - y
        return x, y


class LabelFlip(Attack):
    name = "label_flip"
    targets = None  # poisons data: any algorithm

    def wrap_data(self, data):
        return PoisonedData(data, self.malicious)
