"""Local training only: the no-collaboration baseline of personalized FL.

Every client trains its own model on its own data, starting from the common initial model
(the seed's, as FedAvg's w^0) and continuing from where it stopped the last time it was
sampled; `client.local_epochs` per round it is sampled, so its training budget is FedAvg's.
Nothing is communicated (0 bits each way), models live in the client store, and there is no
global model: only personal metrics are reported. A client never sampled keeps the initial
model. Nothing travels, so an eavesdropper can rebuild no model (no membership audit metric).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import nn

from fedexp.core.algorithm import Algorithm, BuildContext
from fedexp.core.client import ClientModule
from fedexp.core.cohort import CohortStart, resident
from fedexp.core.seeding import INIT, derive_seed
from fedexp.core.types import ClientResult, Message, Nothing, RoundContext, ServerState
from fedexp.models.running_stats import (
    load_model_state,
    model_state,
    state_of_rows,
    state_rows,
)


class Local(Algorithm):
    """Each client alone; the server only keeps the initial model for never-sampled clients."""

    has_personal_models = True

    upload_type = Nothing

    def __init__(self, ctx: BuildContext):
        super().__init__(ctx)
        self.module = ClientModule(ctx.model_factory().to(self.device), ctx.client)
        self.eval_model = ctx.model_factory().to(self.device)

    def _params(self, model: nn.Module) -> list[nn.Parameter]:
        return list(model.parameters())

    # ---- server --------------------------------------------------------------------------------
    def init_state(self) -> ServerState:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(derive_seed(self.ctx.seed, INIT))  # FedAvg's w^0
            model = self.ctx.model_factory().to(self.device)
        state = ServerState(params=None, buffers={"initial": model_state(model)})
        self.on_resume(state)
        return state

    def on_resume(self, state: ServerState) -> None:
        self._initial = state.buffers["initial"]

    def configure_round(self, state: ServerState, ctx: RoundContext) -> Mapping[int, Message]:
        return {cid: Nothing() for cid in ctx.client_ids}

    def aggregate(
        self, state: ServerState, results: Sequence[ClientResult], ctx: RoundContext
    ) -> tuple[ServerState, dict[str, float]]:
        return state, {}

    # ---- client --------------------------------------------------------------------------------
    def client_module(self, client_id: int) -> ClientModule:
        return self.module

    def begin(self, module: ClientModule, client_ids, payloads, stats) -> CohortStart:
        """Each client's own model (parameters and running statistics) from the store."""
        rows = self.store.gather(client_ids, self._initial)
        own = state_rows(module.model, rows, prefix="model.")
        return CohortStart(resident(module, len(client_ids), own))

    def end(self, module: ClientModule, payloads, params, training) -> Message:
        self.store.scatter(training.client_ids, state_of_rows(module.model, params, "model."))
        return Nothing()

    # ---- evaluation ----------------------------------------------------------------------------
    def personal_model(self, state: ServerState, client_id: int) -> nn.Module | None:
        load_model_state(self.eval_model, self.store.get(client_id, self._initial))
        return self.eval_model

    def describe(self) -> dict[str, float]:
        total = sum(p.numel() for p in self.eval_model.parameters())
        return {"params/total": total, "params/uploaded_per_client": 0}
