"""Which samples a model classifies right and its loss on each: per-sample hits and cross-entropy,
accuracy, and one model's accuracy on every client's local split in one batched pass."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

EVAL_BATCH = 4096


def _outcomes(logits: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sample correctness and cross-entropy of one batch's logits (the loss in float64)."""
    losses = F.cross_entropy(logits.double(), y.long(), reduction="none")
    return logits.argmax(1) == y, losses


def _cat(batches: list, device) -> tuple[torch.Tensor, torch.Tensor]:
    if not batches:
        empty = torch.zeros(0, device=device)
        return empty.bool(), empty.double()
    hits, losses = zip(*batches)
    return torch.cat(hits), torch.cat(losses)


@torch.no_grad()
def sample_outcomes(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, idx: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(hits, losses): per sample of (x[idx], y[idx]) (all of x and y without `idx`) whether
    `model` classifies it right (bool) and its cross-entropy (float64), from one forward pass,
    gathering one batch at a time (no copy of the indexed samples: the same batches, so the
    same values)."""
    model.eval()
    n = len(y) if idx is None else len(idx)
    out = []
    for i in range(0, n, EVAL_BATCH):
        rows = slice(i, i + EVAL_BATCH) if idx is None else idx[i : i + EVAL_BATCH]
        out.append(_outcomes(model(x[rows]), y[rows]))
    return _cat(out, y.device)


def correct_counts(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Per-sample correctness (bool tensor) of `model` on (x, y)."""
    return sample_outcomes(model, x, y)[0]


def indexed_hits(model: nn.Module, x: torch.Tensor, y: torch.Tensor, idx: torch.Tensor):
    """`correct_counts(model, x[idx], y[idx])`, gathering one batch at a time."""
    return sample_outcomes(model, x, y, idx)[0]


def mean_of(values: torch.Tensor) -> float:
    """The mean of per-sample hits or losses (float32 for hits, as `accuracy`); NaN if none."""
    if not len(values):
        return float("nan")
    return float(values.float().mean() if values.dtype == torch.bool else values.mean())


def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    return mean_of(correct_counts(model, x, y))


def client_accuracies(model: nn.Module, data, split: str = "test") -> np.ndarray:
    """One model's accuracy on every client's local test split (NaN where a split is empty).

    One batched pass and one host sync instead of one per client (1000 clients, every 10
    rounds, cost more than the training itself on a GPU). Per-client sums of hits are exact,
    so the values equal those of a per-client `accuracy` loop wherever the two passes' logits
    give the same argmax (the passes batch the samples differently, so the logits agree to
    float tolerance).
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


def losses_from_samples(losses: torch.Tensor, data, split: str = "test") -> np.ndarray:
    """Every client's mean cross-entropy from the per-sample losses of one pass over the local
    `split` in `data.local_index(split)` order (NaN where a split is empty)."""
    owner = data.owners(split)
    n = data.num_clients
    totals = torch.bincount(owner, weights=losses.double(), minlength=n).double()
    counts = torch.bincount(owner, minlength=n).double()
    return (totals / counts).cpu().numpy()
