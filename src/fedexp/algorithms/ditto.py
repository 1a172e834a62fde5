"""Ditto (Li et al., ICML 2021, "Ditto: Fair and Robust Federated Learning through
Personalization").

Objective (2) of the paper: the global model solves FedAvg's G(w) = sum_k p_k F_k(w), and each
client k keeps a personal model solving

    min_{v_k} h_k(v_k; w*) = F_k(v_k) + (lam / 2) ||v_k - w*||^2.

Algorithm 1, per round t and sampled client k: (i) update the global model w^t locally as FedAvg
does (`client.local_epochs`) and upload the delta w_k^t - w^t; (ii) update v_k by SGD steps on
h_k(v_k; w^t), v_k <- v_k - eta (grad F_k(v_k) + lam (v_k - w^t)), anchored to the round's
received global model w^t (not to w_k^t), for `personal_epochs` passes over the data. The server
aggregates as FedAvg (`weighting`, `server_lr`, `server_momentum`, any aggregator).
`personal_epochs: auto` is `client.local_epochs`: w_k and v_k get E epochs each a round, as in
the authors' code (litian96/ditto: every step on v_k is paired with one on w_k) and in
lgcollins/FedRep's Ditto (`local_ep` epochs for each); an integer overrides.

Both updates are phases of one client module that holds the global copy (`model`) and the
personal model (`personal`): phase `global` trains the first with the task loss, phase
`personal` the second with the proximal objective, each with a fresh `client.optimizer` (as the
authors' code, which steps plain SGD with the client learning rate on both). The reported
training loss is the mean over both phases' steps. Personal models live in the client store; a
client never sampled has the initial global model w^0 as its personal model (the authors'
code starts every v_k from the initial model). Personal metrics come from the personal models,
global metrics from w.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn

from fedexp.algorithms.fedavg import FedAvg, payload_rows
from fedexp.core.algorithm import BuildContext
from fedexp.core.client import ClientModule, Phase
from fedexp.core.cohort import CohortStart
from fedexp.core.local import ClientConfig
from fedexp.core.types import ConfigError, Message, ServerState
from fedexp.models.running_stats import load_model_state, model_state, state_of_rows, state_rows


class DittoModule(ClientModule):
    """The global copy (`model`, FedAvg's local objective) and the personal model (`personal`,
    the task loss plus (lam/2) ||v - w^t||^2), trained one after the other."""

    per_client_state = ("anchor",)  # given by begin

    def __init__(
        self,
        model: nn.Module,
        personal: nn.Module,
        client: ClientConfig,
        lam: float,
        personal_epochs: int,
    ):
        super().__init__(model, client)
        self.personal = personal
        self.lam = lam
        self.personal_epochs = personal_epochs
        self.anchor: list[torch.Tensor] = []  # w^t, the round's received global model

    def phases(self) -> list[Phase]:
        return [
            Phase("global", self._local_epochs, self.model_params()),
            Phase("personal", self.personal_epochs, tuple(self.personal.parameters())),
        ]

    def start_phase(self, phase: Phase) -> None:
        super().start_phase(phase)
        keep = phase.name == "personal"
        for p in self.personal.parameters():
            if p.requires_grad != keep:
                p.requires_grad_(keep)

    def training_step(self, batch, batch_idx: int) -> torch.Tensor:
        if self.current_phase != "personal":
            return self.task_loss(batch, batch_idx)
        prox = sum(((v - a) ** 2).sum() for v, a in zip(self.personal.parameters(), self.anchor))
        return self.task_loss(batch, batch_idx, model=self.personal) + 0.5 * self.lam * prox


class Ditto(FedAvg):
    """FedAvg's global model plus a personal model per client (client store)."""

    has_personal_models = True

    def __init__(
        self, ctx: BuildContext, lam: float, personal_epochs: int | Literal["auto"], **kwargs
    ):
        if isinstance(lam, bool) or not isinstance(lam, (int, float)) or lam < 0:
            raise ConfigError(f"algorithm.lam: must be a number >= 0, got {lam!r}")
        if personal_epochs == "auto":
            personal_epochs = ctx.client.local_epochs
        if isinstance(personal_epochs, bool) or not isinstance(personal_epochs, int):
            raise ConfigError(
                f"algorithm.personal_epochs: must be int or auto, got {personal_epochs!r}"
            )
        if personal_epochs < 1:
            raise ConfigError(f"algorithm.personal_epochs: must be >= 1, got {personal_epochs}")
        if ctx.client.optimizer == "module":
            raise ConfigError(
                "client.optimizer: Ditto trains a global and a personal model, each with its own "
                "optimizer; a model's configure_optimizers covers one: use sgd or adam"
            )
        self.lam, self.personal_epochs = float(lam), personal_epochs
        super().__init__(ctx, **kwargs)

    def make_module(self, model: nn.Module) -> ClientModule:
        return DittoModule(
            model, self.build_model(), self.ctx.client, self.lam, self.personal_epochs
        )

    def init_state(self) -> ServerState:
        state = super().init_state()
        # v_k of a client never sampled: the initial weights, then its running statistics
        state.buffers["initial"] = model_state(self.eval_model)  # holds w^0 after super()
        self.on_resume(state)
        return state

    def on_resume(self, state: ServerState) -> None:
        self._initial = state.buffers["initial"]

    def _personal(self, client_id: int) -> torch.Tensor:
        return self.store.get(client_id, self._initial)

    def begin(self, module: DittoModule, client_ids, payloads, stats) -> CohortStart:
        """FedAvg's start for the global copy; each client's personal model (parameters and
        running statistics) from the store; the anchor w^t is the received weights: the
        broadcast once for every client where all of them got the same."""
        rows = self.store.gather(client_ids, self._initial)
        own = state_rows(module.personal, rows, prefix="personal.")
        start = self.cohort_start(module, payloads, stats, own)
        vector = payload_rows(payloads)
        if vector.dim() == 1:
            start.shared["anchor"] = self.payload_views(module, vector)
        else:
            start.attrs["anchor"] = [start.params[n] for n in self._global_names(module)]
        return start

    def end(self, module: DittoModule, payloads, params, training) -> Message:
        self.store.scatter(training.client_ids, state_of_rows(module.personal, params, "personal."))
        return super().end(module, payloads, params, training)

    def _global_names(self, module: DittoModule) -> list[str]:
        """The global copy's shared parameters by name in the module (the anchor's order)."""
        names = {id(p): n for n, p in module.named_parameters()}
        return [names[id(p)] for p in self.shared(module.model)]

    def personal_model(self, state: ServerState, client_id: int) -> nn.Module | None:
        load_model_state(self.eval_model, self._personal(client_id))
        return self.eval_model
