"""FedOpt (Reddi et al., ICLR 2021): FedAdagrad, FedAdam and FedYogi server optimizers.

"Adaptive Federated Optimization". Clients train as in FedAvg and upload their deltas; the
server treats the aggregated delta Delta_t (the injected aggregator over the uploads, weighted
by `weighting`: `uniform`, the default, is Algorithm 2's plain mean Delta_t = (1/|S|) sum_i
Delta_i; `samples` weights client i by n_i / n) as a pseudo-gradient and applies an adaptive
optimizer to it (Algorithm 2):

    m_t = beta1 * m_{t-1} + (1 - beta1) * Delta_t
    v_t = v_{t-1} + Delta_t^2                                           (FedAdagrad)
    v_t = beta2 * v_{t-1} + (1 - beta2) * Delta_t^2                     (FedAdam)
    v_t = v_{t-1} - (1 - beta2) * Delta_t^2 * sign(v_{t-1} - Delta_t^2)  (FedYogi)
    x_{t+1} = x_t + eta * m_t / (sqrt(v_t) + tau)

with m_{-1} = 0 and v_{-1} = tau^2 (the smallest value Algorithm 2 allows), and, as in the
paper's Algorithm 2, no bias correction and beta1 momentum for all three (beta1 = 0 gives
the momentum-free Adagrad). Defaults are the paper's: tau = 1e-3, beta1 = 0.9, beta2 = 0.99
(beta2 is unused by FedAdagrad); the server learning rate eta is tuned per task in the paper
(a grid over 10^-3 .. 10^1). m and v are server state, so a resumed run continues exactly.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from fedexp.algorithms.aggregation_inputs import aggregate_rows
from fedexp.algorithms.fedavg import FedAvg
from fedexp.core.algorithm import BuildContext
from fedexp.core.types import ClientResult, ConfigError, RoundContext, ServerState

SERVER_OPTIMIZERS = ("adagrad", "adam", "yogi")


def server_step(
    name: str,
    delta: torch.Tensor,
    m: torch.Tensor,
    v: torch.Tensor,
    lr: float,
    tau: float,
    beta1: float,
    beta2: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One step of the server optimizer `name` on the pseudo-gradient `delta`.

    Returns:
        (the step to add to the weights, the new m, the new v).
    """
    m = beta1 * m + (1 - beta1) * delta
    square = delta * delta
    if name == "adagrad":
        v = v + square
    elif name == "adam":
        v = beta2 * v + (1 - beta2) * square
    else:  # yogi
        v = v - (1 - beta2) * square * torch.sign(v - square)
    return lr * m / (v.sqrt() + tau), m, v


class FedOpt(FedAvg):
    """FedAvg's clients with an adaptive server optimizer on the averaged client delta.

    Args:
        ctx: what the algorithm is built from.
        weighting: `uniform` (Algorithm 2's mean) or `samples` (n_k / n) weights of the deltas.
        server_optimizer: `adagrad`, `adam` or `yogi`.
        server_lr: the server learning rate eta.
        tau: the adaptivity tau (> 0); v starts at tau^2.
        beta1: first-moment decay, in [0, 1).
        beta2: second-moment decay of Adam and Yogi, in [0, 1).
        server_lr_schedule, server_lr_decay, server_lr_step_rounds, server_lr_min,
            server_lr_warmup_rounds: eta across rounds, as FedAvg's (`fedexp.core.local`;
            constant by default).
    """

    def __init__(
        self,
        ctx: BuildContext,
        weighting: str,
        server_optimizer: str,
        server_lr: float,
        tau: float,
        beta1: float,
        beta2: float,
        server_lr_schedule: str,
        server_lr_decay: float,
        server_lr_step_rounds: int,
        server_lr_min: float,
        server_lr_warmup_rounds: int,
    ):
        if server_optimizer not in SERVER_OPTIMIZERS:
            raise ConfigError(
                f"algorithm.server_optimizer: must be one of {list(SERVER_OPTIMIZERS)}, "
                f"got {server_optimizer!r}"
            )
        if not tau > 0:
            raise ConfigError(f"algorithm.tau: must be > 0, got {tau}")
        for key, beta in (("beta1", beta1), ("beta2", beta2)):
            if not 0 <= beta < 1:
                raise ConfigError(f"algorithm.{key}: must be in [0, 1), got {beta}")
        self.server_optimizer = server_optimizer
        self.tau, self.beta1, self.beta2 = float(tau), float(beta1), float(beta2)
        super().__init__(
            ctx, weighting=weighting, server_lr=server_lr, server_momentum=0.0,
            server_lr_schedule=server_lr_schedule, server_lr_decay=server_lr_decay,
            server_lr_step_rounds=server_lr_step_rounds, server_lr_min=server_lr_min,
            server_lr_warmup_rounds=server_lr_warmup_rounds,
        )  # fmt: skip

    def init_state(self) -> ServerState:
        state = super().init_state()
        state.buffers["m"] = torch.zeros_like(state.params)
        state.buffers["v"] = torch.full_like(state.params, self.tau**2)
        return state

    def aggregate(
        self, state: ServerState, results: Sequence[ClientResult], ctx: RoundContext
    ) -> tuple[ServerState, dict[str, float]]:
        delta, kept = aggregate_rows(
            self, self.stack_uploads(results), self.client_weights(results), state, ctx
        )
        step, m, v = server_step(
            self.server_optimizer,
            delta,
            state.buffers["m"],
            state.buffers["v"],
            self.server_lr_at(ctx.round),
            self.tau,
            self.beta1,
            self.beta2,
        )
        new = ServerState(state.params + step, {**state.buffers, "m": m, "v": v, **kept})
        return self.with_averaged_stats(new, results), {}
