"""Local training only: the no-collaboration baseline of personalized FL.

Every client trains its own model on its own data, starting from the common initial model
(the seed's, as FedAvg's w^0) and continuing from where it stopped the last time it was
sampled; `client.local_epochs` per round it is sampled, so its training budget is FedAvg's.
Nothing is communicated (0 bits each way), models live in the client store, and there is no
global model: only personal metrics are reported. A client never sampled keeps the initial
model. Nothing travels, so an eavesdropper can rebuild no model (no membership audit metric).

With a model family (`model=cnn_family`, `mlp_family`: heterogeneous clients) each client
trains the architecture drawn for it (`fedexp.core.seeding.client_arch`, as FedHeNN's and
FedProto's clients) from its own initial model, seeded by (seed, client id) as theirs: the
isolated-training reference of a heterogeneous comparison.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch
from torch import nn

from fedexp.core.algorithm import Algorithm, BuildContext
from fedexp.core.client import ClientModule
from fedexp.core.cohort import CohortStart, resident
from fedexp.core.seeding import INIT, client_arch, derive_seed
from fedexp.core.types import ClientResult, Message, Nothing, RoundContext, ServerState
from fedexp.models.family import family_size
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
        self.num_archs = family_size(ctx.model_factory)  # None: one architecture
        archs = range(self.num_archs or 1)
        self.modules = [ClientModule(self.build(a).to(self.device), ctx.client) for a in archs]
        self.eval_models = [self.build(a).to(self.device) for a in archs]
        self.module, self.eval_model = self.modules[0], self.eval_models[0]

    def build(self, arch: int = 0) -> nn.Module:
        """A fresh model of architecture `arch` (the one model where there is no family)."""
        return self.ctx.model_factory(arch=arch) if self.num_archs else self.ctx.model_factory()

    def arch_of(self, client_id: int) -> int:
        """The client's architecture (0 without a family), fixed at its creation."""
        return client_arch(self.ctx.seed, client_id, self.num_archs) if self.num_archs else 0

    def _params(self, model: nn.Module) -> list[nn.Parameter]:
        return list(model.parameters())

    # ---- server --------------------------------------------------------------------------------
    def init_state(self) -> ServerState:
        if self.num_archs:  # each client's initial model is rebuilt from (seed, id) when needed
            state = ServerState(params=None, buffers={})
        else:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(derive_seed(self.ctx.seed, INIT))  # FedAvg's w^0
                model = self.ctx.model_factory().to(self.device)
            state = ServerState(params=None, buffers={"initial": model_state(model)})
        self.on_resume(state)
        return state

    def on_resume(self, state: ServerState) -> None:
        self._initial = state.buffers.get("initial")

    def initial_row(self, client_id: int) -> torch.Tensor:
        """The client's initial model (`model_state`): the common one, or with a family its own,
        built from (seed, client id) and not cached."""
        if not self.num_archs:
            return self._initial
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(derive_seed(self.ctx.seed, INIT, client_id))
            model = self.build(self.arch_of(client_id))
        return model_state(model).to(self.device)

    def client_rows(self, client_ids: Sequence[int]) -> torch.Tensor:
        """Each client's model (`model_state`, stored or initial), stacked [C, D]."""
        if not self.num_archs:
            return self.store.gather(client_ids, self._initial)
        rows = [self.store.get(c) for c in client_ids]
        return torch.stack(
            [r if r is not None else self.initial_row(c) for r, c in zip(rows, client_ids)]
        )

    def configure_round(self, state: ServerState, ctx: RoundContext) -> Mapping[int, Message]:
        return {cid: Nothing() for cid in ctx.client_ids}

    def aggregate(
        self, state: ServerState, results: Sequence[ClientResult], ctx: RoundContext
    ) -> tuple[ServerState, dict[str, float]]:
        return state, {}

    # ---- client --------------------------------------------------------------------------------
    def client_module(self, client_id: int) -> ClientModule:
        return self.modules[self.arch_of(client_id)]

    def begin(self, module: ClientModule, client_ids, payloads, stats) -> CohortStart:
        """Each client's own model (parameters and running statistics) from the store."""
        own = state_rows(module.model, self.client_rows(client_ids), prefix="model.")
        return CohortStart(resident(module, len(client_ids), own))

    def keep(self, module: ClientModule, client_ids, params) -> torch.Tensor:
        """Store each client's trained model; returns them (`model_state` rows [C, D])."""
        rows = state_of_rows(module.model, params, "model.")
        self.store.scatter(client_ids, rows)
        return rows

    def end(self, module: ClientModule, payloads, params, training) -> Message:
        self.keep(module, training.client_ids, params)
        return Nothing()

    # ---- evaluation ----------------------------------------------------------------------------
    def model_of(self, client_id: int, row: torch.Tensor) -> nn.Module:
        """The client's architecture holding `row` (a resident model, reused by the next call)."""
        model = self.eval_models[self.arch_of(client_id)]
        load_model_state(model, row)
        return model

    def personal_model(self, state: ServerState, client_id: int) -> nn.Module | None:
        stored = self.store.get(client_id)
        return self.model_of(
            client_id, stored if stored is not None else self.initial_row(client_id)
        )

    def describe(self) -> dict[str, float]:
        total = sum(p.numel() for p in self.eval_model.parameters())
        out: dict[str, float] = {"params/total": total, "params/uploaded_per_client": 0}
        if self.num_archs:
            archs = [self.arch_of(c) for c in range(self.ctx.data.num_clients)]
            counts = np.bincount(archs, minlength=self.num_archs)
            for a, model in enumerate(self.eval_models):
                out[f"params/arch{a}_clients"] = int(counts[a])
                out[f"params/arch{a}_total"] = sum(p.numel() for p in model.parameters())
        return out
