"""TopK sparsification (e.g. Aji & Heafield, 2017; Stich et al., 2018) on FedAvg.

Clients upload the `fraction` of their update's coordinates largest in |value| (values and
indices); the server densifies and aggregates them like FedAvg (zeros elsewhere). With
`error_feedback`, what a client did not send is kept in the client store and added to its next
update. The global model goes down as 32-bit weights.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from fedexp.algorithms.fedavg import FedAvg, payload_rows
from fedexp.core.algorithm import BuildContext
from fedexp.core.client import ClientModule
from fedexp.core.cohort import stack_messages
from fedexp.core.flat import load_flat
from fedexp.core.types import ClientResult, ConfigError, Message, SparseDelta


def top_fraction(vector: torch.Tensor, fraction: float) -> SparseDelta:
    """The round(fraction * d) largest-|value| coordinates of `vector` (at least one)."""
    d = vector.numel()
    count = max(1, min(d, round(fraction * d)))
    indices = torch.topk(vector.abs(), count, sorted=False).indices
    indices = torch.sort(indices).values  # a canonical order on the wire
    return SparseDelta(vector[indices].clone(), indices, d)


class TopK(FedAvg):
    """FedAvg with top-k sparsified uploads and optional error feedback."""

    upload_type = SparseDelta

    def __init__(
        self,
        ctx: BuildContext,
        fraction: float,
        error_feedback: bool,
        **kwargs,
    ):
        if not 0 < fraction <= 1:
            raise ConfigError(f"algorithm.fraction: must be in (0, 1], got {fraction}")
        self.fraction = fraction
        self.error_feedback = error_feedback
        super().__init__(ctx, **kwargs)

    def stack_uploads(self, results: Sequence[ClientResult]) -> torch.Tensor:
        return torch.stack([r.upload.dense() for r in results])

    def end(self, module: ClientModule, payloads, params, training) -> Message:
        """Each client's top coordinates of its update (plus, with error feedback, what it did
        not send before), chosen row by row."""
        ids = training.client_ids
        update = self.cohort_flat(module, params) - payload_rows(payloads)
        if self.error_feedback:
            kept = [c in self.store for c in ids]
            if any(kept):  # a client without a residual adds zeros
                update = update + self.store.gather(ids, torch.zeros_like(update[0]))
        sparse = [top_fraction(row, self.fraction) for row in update]
        if self.error_feedback:
            residual = torch.stack(
                [row.index_fill(0, s.indices, 0.0) for row, s in zip(update, sparse)]
            )
            self.store.scatter(ids, residual)
        return stack_messages(sparse)

    def eavesdropped_model(self, payload: Message, upload: Message) -> nn.Module | None:
        """The broadcast weights plus the densified upload. With error feedback the upload holds
        the residual of earlier rounds too: it is what the server sees, not the exact local model.
        """
        load_flat(self.shared(self.eval_model), payload.vector + upload.dense())
        return self.eval_model
