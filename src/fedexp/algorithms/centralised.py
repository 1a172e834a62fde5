"""Centralised training: the pooled-data upper reference of FedAvg, with FedAvg's budget.

Design: each round the server trains one model on the union of the round's sampled clients'
training data, as one stream: `client.local_epochs` passes over the pooled samples, shuffled
together, in mini-batches of `client.batch_size` with a fresh `client.optimizer` per round (as a
FedAvg client). The samples seen per round are therefore FedAvg's exactly,
sum_{k in S_t} n_k * E, and over a run the data seen is the same multiset; only the mixing
differs (batches cross client boundaries), which is what separates centralised from
federated training. With full participation a round is E epochs over all the training data.
The optimizer steps differ from FedAvg's (ceil(sum n_k / B) * E rather than
sum ceil(n_k / B) * E) because the pooled stream has one short last batch per epoch, not one
per client.

Clients train nothing (an idle module with no phases) and nothing is communicated: the data is
assumed pooled, so comm bits are 0 each way and there is no upload to rebuild a model from.
The server trains on the clean pooled data, so every attack (they act on what clients train
on or upload) is refused before training (`clients_train = False`). Only global metrics are
reported. Randomness (shuffles, dropout) is a function of (seed, round), so a resumed run
continues exactly.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import nn

from fedexp.core.algorithm import Algorithm, BuildContext
from fedexp.core.client import ClientModule, Phase
from fedexp.core.client_loop import set_round, train_local
from fedexp.core.cohort import CohortStart, resident
from fedexp.core.flat import flat_params, load_flat
from fedexp.core.local import LocalTraining
from fedexp.core.seeding import INIT, derive_seed, seed_global_rng
from fedexp.core.types import ClientResult, Message, Nothing, RoundContext, ServerState

SERVER_STREAM = 59  # derive_seed tag of the server's training randomness


class IdleModule(ClientModule):
    """A client that trains nothing: no phases, no steps."""

    def phases(self) -> list[Phase]:
        return []


class Centralised(Algorithm):
    """One model trained by the server on the round's sampled clients' data, pooled."""

    has_global_model = True

    upload_type = Nothing
    clients_train = False  # an attack on clients is refused before training

    def __init__(self, ctx: BuildContext):
        super().__init__(ctx)
        self.module = ClientModule(self._model(), ctx.client)  # the server's trainer
        self.idle = IdleModule(self._model(), ctx.client)
        self.eval_model = self._model()

    def _model(self) -> nn.Module:
        return self.ctx.model_factory().to(self.device)

    # ---- server --------------------------------------------------------------------------------
    def init_state(self) -> ServerState:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(derive_seed(self.ctx.seed, INIT))  # FedAvg's w^0
            model = self._model()
        return ServerState(params=flat_params(list(model.parameters())))

    def configure_round(self, state: ServerState, ctx: RoundContext) -> Mapping[int, Message]:
        return {cid: Nothing() for cid in ctx.client_ids}

    def pooled(self, client_ids: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """The union of the clients' training data, in client id order."""
        xs, ys = zip(*(self.ctx.data.train(cid) for cid in client_ids))
        return torch.cat(xs), torch.cat(ys)

    def train_round(self, state: ServerState, ctx: RoundContext) -> LocalTraining:
        """E epochs over the round's pooled data, from `state.params`, in `self.module`."""
        load_flat(list(self.module.model.parameters()), state.params)
        seed_global_rng(derive_seed(ctx.seed, SERVER_STREAM, ctx.round, 1), self.device)
        generator = torch.Generator().manual_seed(derive_seed(ctx.seed, SERVER_STREAM, ctx.round))
        x, y = self.pooled(ctx.client_ids)
        transform = getattr(self.ctx.data, "batch_transform", None)
        batch_size = self.ctx.client.batch_size
        set_round(self.module, ctx.round)  # the round's lr (`client.lr_schedule`)
        return train_local(self.module, x, y, batch_size, generator, transform)

    def aggregate(
        self, state: ServerState, results: Sequence[ClientResult], ctx: RoundContext
    ) -> tuple[ServerState, dict[str, float]]:
        training = self.train_round(state, ctx)
        params = flat_params(list(self.module.model.parameters()))
        epochs = self.ctx.client.local_epochs
        metrics = {
            "train/loss": float(training.mean_loss),  # the server's, over its steps
            "server/samples_seen": training.samples * epochs,
            "server/steps": training.steps,
        }
        return ServerState(params, dict(state.buffers)), metrics

    # ---- client --------------------------------------------------------------------------------
    def client_module(self, client_id: int) -> ClientModule:
        return self.idle

    def begin(self, module: ClientModule, client_ids, payloads, stats) -> CohortStart:
        return CohortStart(resident(module, len(client_ids)))  # the idle module, untouched

    def end(self, module: ClientModule, payloads, params, training) -> Message:
        return Nothing()

    # ---- evaluation ----------------------------------------------------------------------------
    def global_model(self, state: ServerState) -> nn.Module | None:
        load_flat(list(self.eval_model.parameters()), state.params)
        return self.eval_model

    def describe(self) -> dict[str, float]:
        total = sum(p.numel() for p in self.eval_model.parameters())
        return {"params/total": total, "params/uploaded_per_client": 0}
