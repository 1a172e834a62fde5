"""FedNova (Wang et al., 2020): FedAvg whose clients' updates are normalised by how far each
one's local solver went, so clients that take more local steps do not pull the global model
towards their own objective.

A client that takes tau_i local SGD steps with momentum rho moves by Delta_i = y_i - x; its
normalising factor is ||a_i||_1 = [tau_i - rho (1 - rho^tau_i) / (1 - rho)] / (1 - rho)
(tau_i for plain SGD). It uploads d_i = Delta_i / ||a_i||_1 and ||a_i||_1; the server steps
x <- x + tau_eff * sum_i p_i d_i with tau_eff = sum_i p_i ||a_i||_1 (the paper's eq. (7) with
the clients' weights p_i, `algorithm.weighting`). With every client taking the same steps this
is FedAvg. The aggregator takes the normalised updates d_i (a robust rule replaces the mean),
and `server_lr` / `server_momentum` act on the step as in FedAvg.

The client half is FedAvg's `begin` and its own `end`, written once for a cohort: FedNova is
three hooks (`upload_type`, `end`, `aggregate`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fedexp.algorithms.aggregation_inputs import aggregate_rows
from fedexp.algorithms.fedavg import FedAvg, payload_rows
from fedexp.core.algorithm import BuildContext
from fedexp.core.cohort import RoundResults
from fedexp.core.types import ConfigError, Message, RoundContext, ServerState, VectorMessage
from fedexp.metrics.comm import FLOAT_BITS


@dataclass(frozen=True)
class NormalizedDelta(VectorMessage):
    """d_i = (y_i - x) / ||a_i||_1 and the client's ||a_i||_1."""

    values: torch.Tensor
    norm: torch.Tensor

    def num_bits(self) -> int:
        return (self.values.numel() + self.norm.numel()) * FLOAT_BITS


def normalizer(steps: torch.Tensor, momentum: float) -> torch.Tensor:
    """||a_i||_1 of local SGD with `momentum` rho after `steps` tau_i: tau_i for rho = 0, else
    [tau_i - rho (1 - rho^tau_i) / (1 - rho)] / (1 - rho)."""
    if momentum == 0:
        return steps
    rho = momentum
    return (steps - rho * (1 - rho**steps) / (1 - rho)) / (1 - rho)


class FedNova(FedAvg):
    upload_type = NormalizedDelta

    def __init__(self, ctx: BuildContext, **fedavg_kwargs):
        if ctx.client.optimizer != "sgd":
            raise ConfigError(
                "client.optimizer: FedNova normalises by the local SGD steps (with momentum); "
                f"got {ctx.client.optimizer}"
            )
        super().__init__(ctx, **fedavg_kwargs)

    def end(self, module, payloads, params, training) -> Message:
        delta = self.cohort_flat(module, params) - payload_rows(payloads)
        steps = torch.tensor(training.steps, dtype=delta.dtype, device=delta.device)
        norm = normalizer(steps, self.ctx.client.momentum)
        # a client that took no step moved nowhere: its d_i is 0 (not 0 / 0)
        return NormalizedDelta(delta / norm.clamp(min=1).unsqueeze(1), norm)

    def aggregate(
        self, state: ServerState, results: RoundResults, ctx: RoundContext
    ) -> tuple[ServerState, dict[str, float]]:
        weights = self.client_weights(results)
        p = weights / weights.sum()
        norms = results.upload_rows("norm").to(p.dtype)
        tau_eff = (p * norms).sum()
        direction, kept = aggregate_rows(self, results.upload_rows("values"), weights, state, ctx)
        new = self.server_step(state, tau_eff * direction, results)
        new.buffers.update(kept)  # a copy of the caller's (`server_step`)
        return new, {"fednova/tau_eff": float(tau_eff)}
