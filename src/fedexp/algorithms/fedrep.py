"""FedRep (Collins et al., ICML 2021): shared body, personal heads.

Each round a client trains its own head for `head_epochs` with the body frozen, then the body for
`body_epochs` with the head frozen. As in the authors' code (lgcollins/FedRep: `local_ep` epochs
in all, the first `local_ep - local_rep_ep` for the head), `head_epochs: auto` is
`client.local_epochs - body_epochs`, so a round costs E epochs like every other method's. Where
that leaves the head none (E = body_epochs, e.g. E = 1: the authors run E >= 10) the head gets
one epoch, the round runs E + 1, and the run's tables say so (`run_warnings`); `body_epochs` > E
is refused. An
integer `head_epochs` overrides. Only the body travels; heads live in the client store. A client
never sampled uses the initial head. There is no global model (no global head), so only personal
metrics are reported.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn

from fedexp.algorithms.fedavg import FedAvg
from fedexp.core.algorithm import BuildContext, PersonalBatch
from fedexp.core.client import ClientModule, Phase
from fedexp.core.cohort import CohortStart, flat_rows
from fedexp.core.flat import flat_params, load_flat, named_views
from fedexp.core.local import ClientConfig
from fedexp.core.types import ConfigError, Message, ServerState
from fedexp.core.user_module import check_head_body


class RepModule(ClientModule):
    def __init__(self, model: nn.Module, client: ClientConfig, head_epochs: int, body_epochs: int):
        super().__init__(model, client)
        self.head_epochs = head_epochs
        self.body_epochs = body_epochs

    def phases(self) -> list[Phase]:
        phases = [
            Phase("head", self.head_epochs, tuple(self.model.head.parameters())),
            Phase("body", self.body_epochs, tuple(self.model.body.parameters())),
        ]
        return [phase for phase in phases if phase.epochs > 0]


def phase_epochs(head_epochs: int | str, body_epochs: int, local_epochs: int) -> tuple[int, int]:
    """(head, body) epochs of a round; `head_epochs: auto` is E - body_epochs (E =
    `client.local_epochs`), and 1 where that leaves none (E = body_epochs, e.g. E = 1)."""
    for key, value in (("head_epochs", head_epochs), ("body_epochs", body_epochs)):
        if value == "auto" and key == "head_epochs":
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            kinds = "auto or an int >= 0" if key == "head_epochs" else "an int >= 0"
            raise ConfigError(f"algorithm.{key}: must be {kinds}, got {value!r}")
    if head_epochs == "auto":
        if body_epochs > local_epochs:
            raise ConfigError(
                f"algorithm.body_epochs: must be <= client.local_epochs ({local_epochs}) with "
                f"head_epochs: auto (the head trains the rest of the E epochs), got {body_epochs}"
            )
        # the authors' split of E epochs; a head that never trains is no FedRep, so at
        # E = body_epochs the head gets one epoch of its own (the round then runs E + 1)
        head_epochs = max(local_epochs - body_epochs, 1)
    if head_epochs + body_epochs == 0:
        raise ConfigError("algorithm.head_epochs/body_epochs: not both 0")
    return head_epochs, body_epochs


def epoch_warnings(head_epochs: int, body_epochs: int, local_epochs: int) -> list[str]:
    """What the round's epochs change: a part that never trains, or a round longer than the
    E epochs of the methods it is compared with."""
    if head_epochs == 0:
        return [
            "FedRep: algorithm.head_epochs=0: the heads never train, every client keeps its "
            "initial head"
        ]
    if body_epochs == 0:
        return ["FedRep: algorithm.body_epochs=0: the shared body never trains"]
    if head_epochs + body_epochs != local_epochs:
        return [
            f"FedRep: {head_epochs} head + {body_epochs} body epochs a round, "
            f"{head_epochs + body_epochs} in all against client.local_epochs={local_epochs} "
            f"(algorithm.head_epochs, body_epochs)"
        ]
    return []


class FedRep(FedAvg):
    has_global_model = False  # the global body has no head: personal metrics only
    has_personal_models = True
    batches_personal_models = True

    def __init__(
        self,
        ctx: BuildContext,
        head_epochs: int | Literal["auto"],
        body_epochs: int,
        **kwargs,
    ):
        epochs = phase_epochs(head_epochs, body_epochs, ctx.client.local_epochs)
        self.head_epochs, self.body_epochs = epochs
        self._head_auto = head_epochs == "auto"
        super().__init__(ctx, **kwargs)

    def run_warnings(self, rounds: int) -> list[str]:
        return epoch_warnings(self.head_epochs, self.body_epochs, self.ctx.client.local_epochs)

    def make_module(self, model: nn.Module) -> ClientModule:
        check_head_body(model, "FedRep")
        return RepModule(model, self.ctx.client, self.head_epochs, self.body_epochs)

    def shared(self, model: nn.Module) -> list[nn.Parameter]:
        return list(model.body.parameters())

    def init_state(self) -> ServerState:
        state = super().init_state()
        state.buffers["initial_head"] = flat_params(list(self.eval_model.head.parameters()))
        if hasattr(self, "head_epochs"):  # FedPer (a subclass) trains in one phase
            state.buffers["phase_epochs"] = torch.tensor([self.head_epochs, self.body_epochs])
        self.on_resume(state)
        return state

    def on_resume(self, state: ServerState) -> None:
        # the head a never-sampled client starts from is server state, kept in the buffers
        self._initial_head = state.buffers["initial_head"]
        if hasattr(self, "head_epochs"):
            self._check_phase_epochs(state.buffers.get("phase_epochs"))

    def _check_phase_epochs(self, saved) -> None:
        """A checkpoint continues only the round it was trained with: one saved before the
        epochs were recorded had `head_epochs: auto` = E − body_epochs, 0 at E = body_epochs."""
        if saved is None:
            local = self.ctx.client.local_epochs
            head = local - self.body_epochs if self._head_auto else self.head_epochs
            saved = (head, self.body_epochs)
        saved = tuple(int(x) for x in saved)
        if saved != (self.head_epochs, self.body_epochs):
            raise ConfigError(
                f"resume: the checkpoint's FedRep rounds trained {saved[0]} head + {saved[1]} "
                f"body epochs, this version's {self.head_epochs} + {self.body_epochs} "
                "(head_epochs: auto no longer gives the head 0 epochs): start the run again"
            )

    def _head(self, client_id: int):
        return self.store.get(client_id, self._initial_head)

    def begin(self, module: ClientModule, client_ids, payloads, stats) -> CohortStart:
        """The global body for every client; each client's head from the store, stacked."""
        heads = self.store.gather(client_ids, self._initial_head)
        own = named_views(heads, module, list(module.model.head.parameters()))
        return self.cohort_start(module, payloads, stats, own)

    def end(self, module: ClientModule, payloads, params, training) -> Message:
        heads = flat_rows(module, params, list(module.model.head.parameters()))
        self.store.scatter(training.client_ids, heads)
        return super().end(module, payloads, params, training)

    def global_model(self, state: ServerState) -> nn.Module | None:
        return None

    def personal_model(self, state: ServerState, client_id: int) -> nn.Module | None:
        load_flat(self.shared(self.eval_model), state.params)
        self.load_stats(self.eval_model, state.buffers.get("stats"))  # the body's, if any
        load_flat(list(self.eval_model.head.parameters()), self._head(client_id))
        return self.eval_model

    def personal_models(self, state: ServerState, client_ids) -> PersonalBatch | None:
        """The global body once, the clients' heads stacked (batched personal evaluation)."""
        model = self.eval_model
        self.load_stats(model, state.buffers.get("stats"))  # the body's, if any
        heads = torch.stack([self._head(c) for c in client_ids])
        shared = named_views(state.params, model, self.shared(model))
        shared.update(model.named_buffers())
        stacked = named_views(heads, model, list(model.head.parameters()))
        return PersonalBatch(model, shared, stacked)

    def eavesdropped_model(self, payload: Message, upload: Message) -> nn.Module | None:
        """The uploaded body with the initial head: the client's own head never travels."""
        load_flat(self.shared(self.eval_model), payload.vector + upload.vector)
        load_flat(list(self.eval_model.head.parameters()), self._initial_head)
        return self.eval_model
