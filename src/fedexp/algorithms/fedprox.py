"""FedProx (Li et al., 2020): FedAvg whose local loss adds (mu/2) * ||w - w_global||^2."""

from __future__ import annotations

import torch
from torch import nn

from fedexp.algorithms.fedavg import FedAvg, payload_rows
from fedexp.core.algorithm import BuildContext
from fedexp.core.client import ClientModule
from fedexp.core.cohort import CohortStart
from fedexp.core.local import ClientConfig
from fedexp.core.types import ConfigError


class ProxModule(ClientModule):
    """Task loss plus the proximal term towards the round's global weights."""

    per_client_state = ("anchor",)  # given by begin

    def __init__(self, model: nn.Module, client: ClientConfig, mu: float):
        super().__init__(model, client)
        self.mu = mu
        self.anchor: list[torch.Tensor] = []

    def training_step(self, batch, batch_idx: int) -> torch.Tensor:
        prox = sum(((p - a) ** 2).sum() for p, a in zip(self.model.parameters(), self.anchor))
        return self.task_loss(batch, batch_idx) + 0.5 * self.mu * prox


class FedProx(FedAvg):
    def __init__(self, ctx: BuildContext, mu: float, **kwargs):
        if mu < 0:
            raise ConfigError(f"algorithm.mu: must be >= 0, got {mu}")
        self.mu = mu
        super().__init__(ctx, **kwargs)

    def make_module(self, model: nn.Module) -> ClientModule:
        return ProxModule(model, self.ctx.client, self.mu)

    def begin(self, module: ProxModule, client_ids, payloads, stats) -> CohortStart:
        """Every client's anchor is its starting weights: the broadcast, once for every client
        where all of the model's parameters travel."""
        start = super().begin(module, client_ids, payloads, stats)
        vector = payload_rows(payloads)
        if vector.dim() == 1 and len(self.shared(module.model)) == len(
            list(module.model.parameters())
        ):
            start.shared["anchor"] = self.payload_views(module, vector)
        else:
            names = [f"model.{n}" for n, _ in module.model.named_parameters()]
            start.attrs["anchor"] = [start.params[n] for n in names]
        return start
