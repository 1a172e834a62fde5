"""SignSGD with majority vote (Bernstein et al., 2019), federated as in the FRL paper's baseline.

Clients train like FedAvg and upload sign(Δ_u), 1 bit per coordinate (sign(0) = +1, as in
Bernstein et al.). The server moves w <- w + server_lr * sign(agg(signs)); with the default
aggregator `sign_vote` that is sign(Σ_u sign(Δ_u)), the majority vote. The global model goes down
as 32-bit weights (clients are stateless).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from fedexp.algorithms.aggregation_inputs import aggregate_rows
from fedexp.algorithms.fedavg import CONSTANT_SERVER_LR, FedAvg, payload_rows
from fedexp.core.algorithm import BuildContext
from fedexp.core.client import ClientModule
from fedexp.core.flat import load_flat
from fedexp.core.types import ClientResult, Message, RoundContext, ServerState, Signs


def to_signs(delta: torch.Tensor) -> torch.Tensor:
    """+1 where delta >= 0, -1 elsewhere, as int8 (the 1-bit wire format)."""
    return torch.where(delta >= 0, 1, -1).to(torch.int8)


class SignSGD(FedAvg):
    """FedAvg's client half; signs up, a signed step down."""

    upload_type = Signs

    def __init__(self, ctx: BuildContext, server_lr: float, weighting: str):
        super().__init__(
            ctx, weighting=weighting, server_lr=server_lr, server_momentum=0.0, **CONSTANT_SERVER_LR
        )

    def stack_uploads(self, results: Sequence[ClientResult]) -> torch.Tensor:
        return torch.stack([r.upload.values for r in results]).to(torch.float32)

    def aggregate(
        self, state: ServerState, results: Sequence[ClientResult], ctx: RoundContext
    ) -> tuple[ServerState, dict[str, float]]:
        votes, kept = aggregate_rows(
            self, self.stack_uploads(results), self.client_weights(results), state, ctx
        )
        direction = torch.sign(votes)
        metrics = {"signsgd/tied_fraction": float((direction == 0).float().mean())}
        new = ServerState(state.params + self.server_lr * direction, {**state.buffers, **kept})
        return self.with_averaged_stats(new, results), metrics

    def end(self, module: ClientModule, payloads, params, training) -> Message:
        return Signs(to_signs(self.cohort_flat(module, params) - payload_rows(payloads)))

    def eavesdropped_model(self, payload: Message, upload: Message) -> nn.Module | None:
        """w + server_lr * sign(Δ_u): the model the server would step to were this client the only
        voter. The signs carry no magnitudes, so the client's own local model cannot be rebuilt;
        this is the one model the upload determines (w + signs would be a step of 1 per weight).
        """
        load_flat(self.shared(self.eval_model), payload.vector + self.server_lr * upload.values)
        return self.eval_model
