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

    def train_many(self, client_ids) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
        """The training samples of `client_ids`, client after client, as `train` gives each (a
        batched executor gathers its cohort through this: the real data's own would not flip)."""
        parts = [self.train(int(c)) for c in client_ids]
        xs, ys = [x for x, _ in parts], [y for _, y in parts]
        return torch.cat(xs), torch.cat(ys), [len(y) for y in ys]


class LabelFlip(Attack):
    name = "label_flip"
    targets = None  # poisons data: any algorithm

    def wrap_data(self, data):
        return PoisonedData(data, self.malicious)
