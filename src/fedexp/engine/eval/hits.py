"""Which samples a model classifies right: per-sample hits, accuracy, and one model's accuracy on
every client's local split in one batched pass."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

EVAL_BATCH = 4096


@torch.no_grad()
def correct_counts(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Per-sample correctness (bool tensor) of `model` on (x, y)."""
    model.eval()
    out = [
        model(x[i : i + EVAL_BATCH]).argmax(1) == y[i : i + EVAL_BATCH]
        for i in range(0, len(y), EVAL_BATCH)
    ]
    return torch.cat(out) if out else torch.zeros(0, dtype=torch.bool, device=y.device)


@torch.no_grad()
def indexed_hits(model: nn.Module, x: torch.Tensor, y: torch.Tensor, idx: torch.Tensor):
    """`correct_counts(model, x[idx], y[idx])`, gathering one batch at a time (no copy of the
    indexed samples: the same batches, so the same values)."""
    model.eval()
    out = [
        model(x[idx[i : i + EVAL_BATCH]]).argmax(1) == y[idx[i : i + EVAL_BATCH]]
        for i in range(0, len(idx), EVAL_BATCH)
    ]
    return torch.cat(out) if out else torch.zeros(0, dtype=torch.bool, device=y.device)


def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    hits = correct_counts(model, x, y)
    return float(hits.float().mean()) if len(hits) else float("nan")


def client_accuracies(model: nn.Module, data, split: str = "test") -> np.ndarray:
    """One model's accuracy on every client's local test split (NaN where a split is empty).

    One batched pass and one host sync instead of one per client (1000 clients, every 10
    rounds, cost more than the training itself on a GPU). Per-client sums of hits are exact,
    so the values equal those of a per-client `accuracy` loop.
    """
    idx, _ = data.local_index(split)
    return accuracies_from_hits(indexed_hits(model, data.x, data.y, idx), data, split)


def accuracies_from_hits(hits: torch.Tensor, data, split: str = "test") -> np.ndarray:
    """Every client's accuracy from the hits of one pass over the local `split` in
    `data.local_index(split)` order (`client_accuracies` without the pass)."""
    owner = data.owners(split)
    hits = hits.float()
    n = data.num_clients
    totals = torch.bincount(owner, weights=hits, minlength=n).float()
    counts = torch.bincount(owner, minlength=n).float()
    return (totals / counts).double().cpu().numpy()
