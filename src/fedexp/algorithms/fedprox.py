"""FedProx (Li et al., 2020): FedAvg whose local loss adds (mu/2) * ||w - w_global||^2."""

from __future__ import annotations

import torch
from torch import nn

from fedexp.algorithms.fedavg import FedAvg, payload_rows
from fedexp.core.algorithm import BuildContext
from fedexp.core.client import ClientModule
from fedexp.core.cohort import CohortStart
from fedexp.core.local import ClientConfig
from fedexp.core.types import ConfigError, Message


class ProxModule(ClientModule):
    """Task loss plus the proximal term towards the round's global weights."""

    per_client_state = ("anchor",)  # set by client_begin

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

    def client_begin(self, module: ProxModule, client_id: int, payload: Message) -> None:
        super().client_begin(module, client_id, payload)
        module.anchor = [p.detach().clone() for p in module.model.parameters()]

    def cohort_begin(self, module: ProxModule, client_ids, payloads) -> CohortStart | None:
        """Every client's anchor is the broadcast weights (all of the model's parameters)."""
        if not self.batched_hooks(FedProx) or self.__dict__.get("_round_stats") is not None:
            return None
        if len(self.shared(module.model)) != len(list(module.model.parameters())):
            return None
        vector = payload_rows(payloads)
        anchor = self.payload_views(module, vector)
        start = CohortStart(self.cohort_params(module, payloads))
        (start.shared if vector.dim() == 1 else start.attrs)["anchor"] = anchor
        return start
