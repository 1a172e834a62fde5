"""HeteroFL's messages and its clients' local objective (`fedexp.algorithms.heterofl`)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from fedexp.algorithms import heterofl_slicing as slicing
from fedexp.core.client import ClientModule
from fedexp.core.local import ClientConfig
from fedexp.core.types import VectorMessage
from fedexp.metrics.comm import FLOAT_BITS

WHOLE = -1  # a payload's level where it carries the whole global network


@dataclass(frozen=True)
class SubModel(VectorMessage):
    """The server's payload: the weights of the sub-model of `level` (WHOLE: the global network,
    sent to an id the server gave no level, an audit's shadow, which cuts its own out)."""

    values: torch.Tensor
    level: int

    def num_bits(self) -> int:
        return self.values.numel() * FLOAT_BITS


@dataclass(frozen=True)
class SubModelDelta(VectorMessage):
    """A client's upload: its sub-model's trained weights minus those it received, laid out in
    the global network's coordinates (zero outside its sub-model). Only the `count` entries its
    sub-model holds travel; the server knows which from the level it gave the client."""

    values: torch.Tensor
    count: torch.Tensor  # int64, [] or [C]
    level: torch.Tensor  # int64, [] or [C]

    def num_bits(self) -> int:
        return int(self.count.sum()) * FLOAT_BITS

    def cohort_bits(self, size: int) -> int:
        return int(self.count.sum()) * FLOAT_BITS  # rows of several levels may be stacked


class SubModelModule(ClientModule):
    """A sub-model's local objective, the cross-entropy of its logits. Its static BatchNorm
    layers take their statistics over the batch's real samples (label >= 0), not over the
    padding of a vectorized cohort's short batch (label -100), so every executor trains alike."""

    uses_task_loss = False

    def __init__(self, model: nn.Module, client: ClientConfig):
        super().__init__(model, client)
        self.static_norms = [m for m in model.modules() if isinstance(m, slicing.STATIC)]

    def logits(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if not self.static_norms:
            return self.model(x)
        valid = y >= 0
        for m in self.static_norms:
            object.__setattr__(m, "rows", valid)  # a plain attribute, read in this call only
        try:
            return self.model(x)
        finally:
            for m in self.static_norms:
                object.__setattr__(m, "rows", None)

    def training_step(self, batch, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(self.logits(x, y), y)


class MaskedModule(SubModelModule):
    """The cross-entropy with the logits of the classes the client holds no sample of set to 0
    (the reference code's masked_fill of the scores)."""

    per_client_state = ("label_mask",)  # [num_classes] bool, given by begin

    def __init__(self, model: nn.Module, client: ClientConfig):
        super().__init__(model, client)
        self.label_mask = torch.zeros(0, dtype=torch.bool)

    def training_step(self, batch, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(torch.where(self.label_mask, self.logits(x, y), 0.0), y)
