"""SCAFFOLD (Karimireddy et al., ICML 2020): stochastic controlled averaging.

The server keeps a control variate c and every client its own c_i (zero until the client is
first sampled). A sampled client starts from the global weights x and corrects each local
gradient by the drift between them (Algorithm 1, line 10):

    y_i <- y_i - eta_l * (g_i(y_i) - c_i + c)

and after its K local steps updates its control variate with option II (eq. 4 / line 12):

    c_i+ = c_i - c + (x - y_i) / (K * eta_l),

uploading Delta y_i = y_i - x and Delta c_i = c_i+ - c_i. The server (line 16-17) steps

    x <- x + eta_g * mean_S(Delta y_i),   c <- c + (|S| / N) * mean_S(Delta c_i),

with N the number of clients. The weights' mean is FedAvg's server step (its `weighting`,
aggregator and `server_lr` = eta_g; the authors' experiments and the common reference code
weight by samples); the control variates' mean is the plain mean of the paper, so
c = sum_S(Delta c_i) / N. With c = c_i = 0 (the first round) this is FedAvg exactly.

The correction enters through the gradient: the local objective is the task loss plus
<y, c - c_i> (with y detached in the value, so the logged loss is the task loss), so it holds on
every executor and with any optimizer; with SGD momentum or weight decay the corrected gradient
goes through them, as in the reference code. K and eta_l are what local training reports
(`LocalTraining.steps`, `.lr`). Both messages carry two float vectors each way.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from fedexp.algorithms.fedavg import FedAvg, payload_rows
from fedexp.core.client import ClientModule
from fedexp.core.cohort import CohortStart
from fedexp.core.local import ClientConfig
from fedexp.core.types import (
    ClientResult,
    ConfigError,
    Message,
    RoundContext,
    ServerState,
    VectorMessage,
)
from fedexp.metrics.comm import FLOAT_BITS

CONTROL = "control"  # the server's control variate c, in `ServerState.buffers`


@dataclass(frozen=True)
class ScaffoldPayload(VectorMessage):
    """The global weights x and the server control variate c."""

    weights: torch.Tensor
    control: torch.Tensor
    vector_field = "weights"

    def num_bits(self) -> int:
        return (self.weights.numel() + self.control.numel()) * FLOAT_BITS


@dataclass(frozen=True)
class ScaffoldUpload(VectorMessage):
    """A client's model delta y_i - x and control-variate delta c_i+ - c_i."""

    delta: torch.Tensor
    control_delta: torch.Tensor
    vector_field = "delta"

    def num_bits(self) -> int:
        return (self.delta.numel() + self.control_delta.numel()) * FLOAT_BITS


class ScaffoldModule(ClientModule):
    """Task loss plus <y, c - c_i>: its gradient adds the correction c - c_i to every step's."""

    per_client_state = ("correction",)  # given by begin

    def __init__(self, model: nn.Module, client: ClientConfig):
        super().__init__(model, client)
        self.correction: list[torch.Tensor] = []  # c - c_i, one tensor per parameter

    def training_step(self, batch, batch_idx: int) -> torch.Tensor:
        loss = self.task_loss(batch, batch_idx)
        # (p - p.detach()) is exactly zero with gradient one: the value stays the task loss
        term = sum(
            ((p - p.detach()) * c).sum() for p, c in zip(self.model.parameters(), self.correction)
        )
        return loss + term


class Scaffold(FedAvg):
    """SCAFFOLD with option II control variates over all model parameters."""

    upload_type = ScaffoldUpload

    def make_module(self, model: nn.Module) -> ClientModule:
        return ScaffoldModule(model, self.ctx.client)

    # ---- server --------------------------------------------------------------------------------
    def init_state(self) -> ServerState:
        state = super().init_state()
        state.buffers[CONTROL] = torch.zeros_like(state.params)
        return state

    def configure_round(self, state: ServerState, ctx: RoundContext) -> Mapping[int, Message]:
        payload = ScaffoldPayload(state.params, state.buffers[CONTROL])
        return {cid: payload for cid in ctx.client_ids}

    def aggregate(
        self, state: ServerState, results: Sequence[ClientResult], ctx: RoundContext
    ) -> tuple[ServerState, dict[str, float]]:
        new, metrics = super().aggregate(state, results, ctx)
        deltas = results.upload_rows("control_delta")
        new.buffers[CONTROL] = state.buffers[CONTROL] + deltas.sum(0) / self.ctx.data.num_clients
        return new, metrics

    # ---- client: one cohort -------------------------------------------------------------------
    def _controls(self, client_ids, payloads) -> torch.Tensor:
        """The clients' control variates c_i [C, d] (zero for a client that has none yet)."""
        return self.store.gather(client_ids, torch.zeros_like(payloads[0].control))

    def begin(self, module: ScaffoldModule, client_ids, payloads, stats) -> CohortStart:
        start = super().begin(module, client_ids, payloads, stats)
        correction = control_rows(payloads) - self._controls(client_ids, payloads)  # c - c_i
        start.attrs["correction"] = self.payload_views(module, correction)
        return start

    def end(self, module, payloads, params, training) -> Message:
        delta = self.cohort_flat(module, params) - payload_rows(payloads)  # y_i - x
        c_i, control = self._controls(training.client_ids, payloads), control_rows(payloads)
        lr = training.lr
        if lr is None:
            raise ConfigError(
                "client.optimizer: SCAFFOLD's control variates need one local learning rate, "
                f"got the rates {sorted(set(training.lrs))}"
            )
        steps = torch.tensor(training.steps, dtype=delta.dtype, device=delta.device)
        c_new = c_i - control - delta / (steps.clamp(min=1) * lr).unsqueeze(1)
        # a client that took no step learned nothing about the drift: its c_i stays
        c_new = torch.where((steps > 0).unsqueeze(1), c_new, c_i)
        trained = [c for c, k in zip(training.client_ids, training.steps) if k > 0]
        if len(trained) == len(training.client_ids):
            self.store.scatter(trained, c_new)
        else:
            rows = [i for i, k in enumerate(training.steps) if k > 0]
            self.store.scatter(trained, c_new[rows])
        return ScaffoldUpload(delta, c_new - c_i)


def control_rows(payloads) -> torch.Tensor:
    """The payloads' server control variate: [d] where every client got the same, else [C, d]."""
    first = payloads[0].control
    if all(p.control is first for p in payloads):
        return first
    return torch.stack([p.control for p in payloads])
