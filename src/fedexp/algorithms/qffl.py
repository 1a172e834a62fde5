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

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import nn
from torch.func import functional_call

from fedexp.aggregators import aggregator_name
from fedexp.aggregators.mean import weighted_mean
from fedexp.algorithms.fedavg import CONSTANT_SERVER_LR, FedAvg
from fedexp.core.algorithm import BuildContext
from fedexp.core.client import ClientModule
from fedexp.core.cohort import CohortStart, CohortTraining
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
    """The client's delta w_bar_k - w and its loss F_k(w) at the start of local training
    (stacked over a cohort: delta [C, d], loss [C])."""

    vector_field = "delta"
    delta: torch.Tensor
    loss: torch.Tensor  # 0-d (one client's)

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
        super().__init__(
            ctx, weighting="uniform", server_lr=1.0, server_momentum=0.0, **CONSTANT_SERVER_LR
        )

    # ---- client: one cohort -------------------------------------------------------------------
    def begin(self, module: ClientModule, client_ids, payloads, stats) -> CohortStart:
        """FedAvg's start; the broadcast running statistics also as the module's `start_stats`
        (the start point `end` measures F_k at)."""
        start = super().begin(module, client_ids, payloads, stats)
        start.shared["start_stats"] = stats
        return start

    def end(
        self,
        module: ClientModule,
        payloads: Sequence[Message],
        params: Mapping[str, torch.Tensor],
        training: CohortTraining,
    ) -> Message:
        """FedAvg's deltas with each client's F_k(w), measured at the received model (the
        payload's weights and the broadcast statistics) on the data it trained on."""
        delta = super().end(module, payloads, params, training).vector
        start = self.cohort_params(module, payloads, getattr(module, "start_stats", None))
        losses = [
            self.start_loss(module, {n: t[i] for n, t in start.items()}, x, y)
            for i, (x, y) in enumerate(training.data)
        ]
        return QfflUpload(delta, torch.stack(losses))

    @torch.no_grad()
    def start_loss(
        self, module: ClientModule, start: Mapping[str, torch.Tensor], x, y
    ) -> torch.Tensor:
        """F_k(w): the mean task loss over (x, y) of the module with the parameters and buffers
        `start` (by name), in eval mode; the module's own tensors are left as they are."""
        if len(y) == 0:
            return torch.zeros((), device=self.device)
        was_training = module.training
        module.eval()
        task = _TaskLoss(module)
        state = {f"inner.{n}": t for n, t in start.items()}
        total = torch.zeros((), device=x.device, dtype=torch.float64)
        size = self.ctx.client.batch_size
        for at in range(0, len(y), size):
            xb, yb = x[at : at + size], y[at : at + size]
            total += functional_call(task, state, ((xb, yb),)).double() * len(yb)
        module.train(was_training)
        module.log_capture.take_step()  # what a model's own training_step logged: not training
        return (total / len(y)).float()

    # ---- server --------------------------------------------------------------------------------
    def aggregate(
        self, state: ServerState, results: Sequence[ClientResult], ctx: RoundContext
    ) -> tuple[ServerState, dict[str, float]]:
        deltas = self.stack_uploads(results)
        losses = results.upload_rows("loss").to(deltas.device)
        step = qffl_step(deltas, losses, self.q, self.lipschitz)
        metrics = {"qffl/start_loss_mean": float(losses.mean())}
        if len(results) > 1:
            metrics["qffl/start_loss_var"] = float(losses.var(unbiased=False))
        new = ServerState(state.params + step, dict(state.buffers))
        return self.with_averaged_stats(new, results), metrics


class _TaskLoss(nn.Module):
    """A client module's `task_loss` as the forward, so `functional_call` can swap the
    parameters in."""

    def __init__(self, inner: ClientModule):
        super().__init__()
        self.inner = inner

    def forward(self, batch) -> torch.Tensor:
        return self.inner.task_loss(batch, 0)
