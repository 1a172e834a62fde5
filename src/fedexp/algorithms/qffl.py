"""q-FedAvg (Li, Sanjabi, Beirami, Smith, ICLR 2020, "Fair Resource Allocation in Federated
Learning"): the q-FFL objective min_w sum_k p_k F_k^{q+1}(w) / (q + 1), solved by Algorithm 2.

Each selected client k receives w, measures F_k = F_k(w) (the mean loss of the received model on
its training data, before any local step), runs FedAvg's local training to w_bar_k and uploads
w_bar_k - w together with F_k. The server computes (Algorithm 2, with L the Lipschitz estimate)

    Delta w_k = L (w - w_bar_k)
    Delta_k   = F_k^q Delta w_k
    h_k       = q F_k^{q-1} ||Delta w_k||^2 + L F_k^q
    w        <- w - sum_k Delta_k / sum_k h_k.

As in the authors' reference code (fair_flearn, qffedavg.py) L = 1 / client.lr and F_k is offset
by 1e-10 before the powers. With q = 0, h_k = L and the update is w <- mean_k w_bar_k: FedAvg
with uniform weights. The clients of a round are sampled uniformly and their terms are not
weighted by size, so the objective solved is q-FFL with p_k = 1/N (every client counts the same).
The paper's p_k = n_k / n (clients sampled with probability n_k / n, their terms summed
unweighted: the reference code's `sampling=2`) is the same objective only when every client
holds the same number of training samples.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from fedexp.aggregators import aggregator_name
from fedexp.aggregators.mean import weighted_mean
from fedexp.algorithms.fedavg import FedAvg
from fedexp.core.algorithm import BuildContext
from fedexp.core.client import ClientModule
from fedexp.core.flat import flat_delta
from fedexp.core.local import LocalTraining
from fedexp.core.types import (
    ClientResult,
    ConfigError,
    Message,
    RoundContext,
    ServerState,
    VectorMessage,
)
from fedexp.metrics.comm import FLOAT_BITS

LOSS_EPS = 1e-10  # the reference code's offset of F_k before F_k^q and F_k^(q-1)


@dataclass(frozen=True)
class QfflUpload(VectorMessage):
    """The client's delta w_bar_k - w and its loss F_k(w) at the start of local training."""

    vector_field = "delta"
    delta: torch.Tensor
    loss: torch.Tensor  # 0-d

    def num_bits(self) -> int:
        return (self.delta.numel() + 1) * FLOAT_BITS


def qffl_step(
    deltas: torch.Tensor, losses: torch.Tensor, q: float, lipschitz: float
) -> torch.Tensor:
    """The server's step (Algorithm 2) from the uploads: rows w_bar_k - w and losses F_k.

    Returns -sum_k F_k^q Delta w_k / sum_k h_k, the change of w, with Delta w_k = L (w - w_bar_k).
    """
    grads = -lipschitz * deltas  # Delta w_k = L (w - w_bar_k)
    f = losses.to(deltas.dtype) + LOSS_EPS
    fq = f.pow(q)
    h = q * f.pow(q - 1) * grads.pow(2).sum(1) + lipschitz * fq
    return -(fq[:, None] * grads).sum(0) / h.sum()


class QFedAvg(FedAvg):
    """q-FedAvg: FedAvg's local training, the q-FFL server step."""

    upload_type = QfflUpload

    def __init__(self, ctx: BuildContext, q: float):
        if isinstance(q, bool) or not isinstance(q, (int, float)) or q < 0:
            raise ConfigError(f"algorithm.q: must be a number >= 0, got {q!r}")
        if getattr(ctx.aggregator, "func", ctx.aggregator) is not weighted_mean:
            name = aggregator_name(ctx.aggregator)
            raise ConfigError(
                f"aggregator: q-FedAvg combines uploads by its own q-weighted step; "
                f"use aggregator=mean, got {name}"
            )
        self.q = float(q)
        self.lipschitz = 1.0 / ctx.client.lr  # the reference code's L
        self._start_loss: dict[int, torch.Tensor] = {}  # F_k of this round's clients
        super().__init__(ctx, weighting="uniform", server_lr=1.0, server_momentum=0.0)

    # ---- client --------------------------------------------------------------------------------
    @torch.no_grad()
    def start_loss(self, module: ClientModule, client_id: int) -> torch.Tensor:
        """F_k(w): the mean task loss of the received model over the client's training data."""
        x, y = module.local_data
        if len(y) == 0:
            return torch.zeros((), device=self.device)
        was_training = module.training
        module.eval()
        total = torch.zeros((), device=x.device, dtype=torch.float64)
        size = self.ctx.client.batch_size
        for start in range(0, len(y), size):
            xb, yb = x[start : start + size], y[start : start + size]
            total += module.task_loss((xb, yb), 0).double() * len(yb)
        module.train(was_training)
        return (total / len(y)).float()

    def client_begin(self, module: ClientModule, client_id: int, payload: Message) -> None:
        super().client_begin(module, client_id, payload)
        self._start_loss[client_id] = self.start_loss(module, client_id)

    def client_end(
        self, module: ClientModule, client_id: int, payload: Message, training: LocalTraining
    ) -> Message:
        delta = flat_delta(self.shared(module.model), payload.vector)
        return QfflUpload(delta, self._start_loss.pop(client_id))

    # ---- server --------------------------------------------------------------------------------
    def aggregate(
        self, state: ServerState, results: Sequence[ClientResult], ctx: RoundContext
    ) -> tuple[ServerState, dict[str, float]]:
        deltas = self.stack_uploads(results)
        losses = torch.stack([r.upload.loss for r in results]).to(deltas.device)
        step = qffl_step(deltas, losses, self.q, self.lipschitz)
        metrics = {"qffl/start_loss_mean": float(losses.mean())}
        if len(results) > 1:
            metrics["qffl/start_loss_var"] = float(losses.var(unbiased=False))
        new = ServerState(state.params + step, dict(state.buffers))
        return self.with_averaged_stats(new, results), metrics
