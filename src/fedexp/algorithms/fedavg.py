"""FedAvg (McMahan et al., 2017), the base of every weight-averaging algorithm here.

Payloads and uploads are read through `VectorMessage.vector` (whatever field holds the weights),
so a subclass whose payload carries more than the weights keeps these hooks. Clients upload their
delta w_k - w; the server applies w <- w + server_lr * v, with
v <- server_momentum * v + agg(deltas). With server_lr = 1 and no momentum this is
w <- sum_k (n_k / n) w_k. The aggregator is injected (mean, or a robust one).

Running statistics (BatchNorm's running mean, variance and batch count) travel with the layers
whose parameters travel: the server broadcasts the global model's, each client loads them before
training and uploads its own after, and the server replaces them by their weighted mean with the
clients' weights p_k (`client_weights`), whatever the aggregator and the server step do to the
parameters: statistics are averaged, not optimised. Attacks leave them as the clients computed
them. The ledger counts them as floats, both ways.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping, Sequence

import torch
from torch import nn

from fedexp.aggregators import INPUTS
from fedexp.algorithms.aggregation_inputs import aggregate_rows
from fedexp.core.algorithm import Algorithm, BuildContext
from fedexp.core.client import ClientModule
from fedexp.core.cohort import CohortStart, CohortTraining, RoundResults, flat_rows, resident
from fedexp.core.flat import (
    flat_params,
    load_flat,
    named_views,
    share_model_storage,
    shared_buffer,
)
from fedexp.core.local import LRSchedule
from fedexp.core.seeding import INIT, derive_seed
from fedexp.core.types import ClientResult, ConfigError, Message, RoundContext, ServerState, Weights
from fedexp.models.running_stats import (
    flat_stats,
    load_stats,
    norm_layers,
    running_buffers,
    stats_views,
)

# a server lr that does not change across rounds, for the algorithms whose server step is not
# FedAvg's schedule-able one (q-FedAvg's, SignSGD's)
CONSTANT_SERVER_LR = dict(
    server_lr_schedule="constant",
    server_lr_decay=1.0,
    server_lr_step_rounds=1,
    server_lr_min=0.0,
    server_lr_warmup_rounds=1,
)


class FedAvg(Algorithm):
    """Federated averaging over the `shared` parameters (all of them here)."""

    has_global_model = True
    can_be_eavesdropped = True

    upload_type = Weights
    # what an aggregator may ask for besides the uploads: its previous output, the server's own
    # update (`fedexp.algorithms.aggregation_inputs`); every aggregate of this family gives them
    aggregator_inputs = INPUTS

    def __init__(
        self,
        ctx: BuildContext,
        weighting: str,
        server_lr: float,
        server_momentum: float,
        server_lr_schedule: str,
        server_lr_decay: float,
        server_lr_step_rounds: int,
        server_lr_min: float,
        server_lr_warmup_rounds: int,
    ):
        super().__init__(ctx)
        if weighting not in ("samples", "uniform"):
            raise ConfigError(f"algorithm.weighting: must be samples or uniform, got {weighting!r}")
        if server_lr <= 0:
            raise ConfigError(f"algorithm.server_lr: must be > 0, got {server_lr}")
        self.weighting = weighting
        self.server_lr = server_lr
        self.server_momentum = server_momentum
        # round t steps at server_schedule.at(server_lr, t) (`fedexp.core.local`); T for
        # cosine: the run's total, which the config's checks give the client config
        self.server_schedule = LRSchedule(
            server_lr_schedule, server_lr_decay, server_lr_step_rounds, server_lr_min,
            server_lr_warmup_rounds, ctx.client.rounds,
        ).check("algorithm.server_lr_", server_lr)  # fmt: skip
        self.module = self.make_module(self.build_model())
        self.eval_model = self.build_model()

    # ---- what is shared ------------------------------------------------------------------------
    def build_model(self) -> nn.Module:
        """A fresh model on the device (subclasses may transform the factory's model)."""
        return self.ctx.model_factory().to(self.device)

    def make_module(self, model: nn.Module) -> ClientModule:
        return ClientModule(model, self.ctx.client)

    def shared(self, model: nn.Module) -> list[nn.Parameter]:
        """The parameters that travel and are averaged (read once per model object: walking the
        module tree twice per client costs as much as a small model's step), laid out in one
        buffer (`share_model_storage`)."""
        cache = self.__dict__.get("_params_cache")
        if cache is None:
            cache = self.__dict__["_params_cache"] = weakref.WeakKeyDictionary()
        if model not in cache:
            cache[model] = tuple(model.parameters())
            share_model_storage(model, cache[model])  # a client's load and upload: one copy each
        return list(cache[model])

    def stat_buffers(self, model: nn.Module) -> list[torch.Tensor]:
        """The running statistics that travel: those of every norm layer whose parameters all
        travel (`shared`). FedRep's body shares its statistics, FedBN none."""
        cache = self.__dict__.get("_stat_layers_cache")
        if cache is None:
            cache = self.__dict__["_stat_layers_cache"] = weakref.WeakKeyDictionary()
        if model not in cache:
            travel = {id(p) for p in self.shared(model)}
            cache[model] = tuple(
                m
                for m in norm_layers(model)
                if all(id(p) in travel for p in m.parameters(recurse=False))
            )
        return running_buffers(cache[model])

    # ---- server --------------------------------------------------------------------------------
    def init_state(self) -> ServerState:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(derive_seed(self.ctx.seed, INIT))
            model = self.build_model()
        load_flat(list(self.module.model.parameters()), flat_params(list(model.parameters())))
        load_flat(list(self.eval_model.parameters()), flat_params(list(model.parameters())))
        state = ServerState(params=flat_params(self.shared(model)))
        stats = flat_stats(self.stat_buffers(model))
        if stats is not None:  # the initial statistics (mean 0, variance 1, no batches)
            state.buffers["stats"] = stats.to(self.device)
        return state

    def broadcast_stats(self, state: ServerState) -> torch.Tensor | None:
        return state.buffers.get("stats")

    def with_averaged_stats(
        self, state: ServerState, results: Sequence[ClientResult]
    ) -> ServerState:
        """`state` with its running statistics replaced by the clients' weighted mean (the
        clients' weights p_k). Every `aggregate` of this family ends with it."""
        stats = results.stats_rows()
        if stats is None:
            return state
        weights = self.client_weights(results).to(torch.float32)
        mean = (weights / weights.sum()) @ stats.to(weights.device)
        return ServerState(state.params, {**state.buffers, "stats": mean})

    def configure_round(self, state: ServerState, ctx: RoundContext) -> Mapping[int, Message]:
        payload = Weights(state.params)
        return {cid: payload for cid in ctx.client_ids}

    def client_weights(self, results: Sequence[ClientResult]) -> torch.Tensor:
        if self.weighting == "uniform":
            return torch.ones(len(results), device=self.device)
        return torch.tensor([float(n) for n in results.num_samples], device=self.device)

    def stack_uploads(self, results: RoundResults) -> torch.Tensor:
        """The round's uploads as dense rows [n, d] for the aggregator."""
        return results.uploads().vector

    def aggregate(
        self, state: ServerState, results: Sequence[ClientResult], ctx: RoundContext
    ) -> tuple[ServerState, dict[str, float]]:
        updates = self.stack_uploads(results)
        step, kept = aggregate_rows(self, updates, self.client_weights(results), state, ctx)
        new = self.server_step(state, step, results, ctx.round)
        new.buffers.update(kept)  # a copy of the caller's (`server_step`)
        return new, {}

    @classmethod
    def depends_on_rounds(cls, cfg) -> list[str]:
        """`algorithm.server_lr_schedule=cosine` anneals over the run's total rounds
        (`fedexp.config.extend`)."""
        if cfg.get("algorithm", {}).get("server_lr_schedule") == "cosine":
            return ["algorithm.server_lr_schedule=cosine"]
        return []

    def server_lr_at(self, round_idx: int | None) -> float:
        """The server lr of round `round_idx` (`algorithm.server_lr_schedule`; None or the
        constant schedule: `server_lr` itself)."""
        if round_idx is None:
            return self.server_lr
        return self.server_schedule.at(self.server_lr, round_idx)

    def round_lrs(self, round_idx: int) -> dict[str, float]:
        return {**super().round_lrs(round_idx), "train/server_lr": self.server_lr_at(round_idx)}

    def server_step(
        self,
        state: ServerState,
        step: torch.Tensor,
        results: RoundResults,
        round_idx: int | None = None,
    ) -> ServerState:
        """w <- w + lr_t * v, v <- server_momentum * v + step (the aggregated update), and the
        clients' running statistics averaged in; lr_t the server lr of round `round_idx`
        (`server_lr_at`)."""
        buffers = dict(state.buffers)  # the caller's state stays as it was
        if self.server_momentum:
            buf = buffers.get("momentum")
            step = step if buf is None else self.server_momentum * buf + step
            buffers["momentum"] = step
        lr = self.server_lr_at(round_idx)
        step = step if lr == 1.0 else lr * step  # x * 1.0 == x
        return self.with_averaged_stats(ServerState(state.params + step, buffers), results)

    # ---- client: one cohort (a single client on the sequential executor) ----------------------
    def client_module(self, client_id: int) -> ClientModule:
        return self.module

    def begin(
        self,
        module: ClientModule,
        client_ids: Sequence[int],
        payloads: Sequence[Message],
        stats: torch.Tensor | None,
    ) -> CohortStart:
        """The payloads' weights; the broadcast running statistics (not those the previous
        client left in the resident module)."""
        return self.cohort_start(module, payloads, stats)

    def cohort_start(
        self, module: ClientModule, payloads: Sequence[Message], stats, own=None
    ) -> CohortStart:
        """`cohort_params` as a start, with the hint that the shared parameters take the
        payloads' weights as one flat vector (one copy each where they share a buffer)."""
        params = self.cohort_params(module, payloads, stats, own)
        return CohortStart(params, flat=[(self.shared(module.model), payload_rows(payloads))])

    def end(
        self,
        module: ClientModule,
        payloads: Sequence[Message],
        params: Mapping[str, torch.Tensor],
        training: CohortTraining,
    ) -> Message:
        return Weights(self.cohort_flat(module, params) - payload_rows(payloads))

    def cohort_params(
        self, module: ClientModule, payloads: Sequence[Message], stats, own=None
    ) -> dict[str, torch.Tensor]:
        """Every client's starting parameters and buffers [C, ...] by name: the payloads'
        weights for the shared parameters; the broadcast running statistics `stats` (or None);
        `own` (name -> [C, ...]) for those kept on the clients; the module's for the rest (as
        the resident module holds them)."""
        model, count = module.model, len(payloads)
        vector = payload_rows(payloads)
        key = (vector, count, stats, module)
        cached = self.__dict__.get("_broadcast_start")
        if cached is not None and all(a is b for a, b in zip(cached[0], key)):
            out = dict(cached[1])  # the same broadcast as the round's previous client
        else:
            shared = self.shared(model)
            names = module.tensor_names()
            out = {}
            if vector.dim() == 1:  # one broadcast for every client
                for p, piece in zip(shared, vector.split([p.numel() for p in shared])):
                    out[names[id(p)]] = piece.view(p.shape).expand(count, *p.shape)
            else:
                views = named_views(vector, model, shared)
                out.update({f"model.{n}": v for n, v in views.items()})
            for n, t in self.stat_rows(module, stats).items():
                out[n] = t.expand(count, *t.shape[1:])
            out = resident(module, count, out)
            # kept for the round's next client (a strong reference: the key's objects stay)
            self.__dict__["_broadcast_start"] = (key, dict(out))
        for n, t in (own or {}).items():
            out[n] = t.expand(count, *t.shape[1:])
        return out

    def stat_rows(self, module: ClientModule, stats: torch.Tensor | None) -> dict:
        """The broadcast running statistics as the module's buffers [1, ...] by name."""
        if stats is None:
            return {}
        buffers = self.stat_buffers(module.model)
        names = module.tensor_names()
        return {names[id(b)]: v.unsqueeze(0) for b, v in zip(buffers, stats_views(buffers, stats))}

    def payload_views(self, module: ClientModule, vector: torch.Tensor) -> list[torch.Tensor]:
        """`vector` ([d] or [C, d]) as views shaped like the shared parameters ([C, ...])."""
        shared = self.shared(module.model)
        pieces = vector.split([p.numel() for p in shared], dim=-1)
        return [c.view(*vector.shape[:-1], *p.shape) for p, c in zip(shared, pieces)]

    def cohort_flat(self, module: ClientModule, params: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """The shared parameters of every client, flat [C, d] (`flat_params` per row); for a
        cohort of one trained in the module, a view of the module's own buffer where its shared
        parameters share one (read it before the module changes)."""
        shared = self.shared(module.model)
        first = params[module.tensor_names()[id(shared[0])]]
        if first.shape[0] == 1 and first.data_ptr() == shared[0].data_ptr():
            buffer = shared_buffer(shared)
            if buffer is not None:
                return buffer.detach().unsqueeze(0)
        return flat_rows(module, params, shared)

    def client_stats(
        self, module: ClientModule, params: Mapping[str, torch.Tensor]
    ) -> torch.Tensor | None:
        buffers = self.stat_buffers(module.model)
        if not buffers:
            return None
        return flat_rows(module, params, buffers).to(torch.float32)

    def load_stats(self, model: nn.Module, stats: torch.Tensor | None) -> None:
        if stats is not None:
            load_stats(self.stat_buffers(model), stats)

    # ---- evaluation ----------------------------------------------------------------------------
    def global_model(self, state: ServerState) -> nn.Module | None:
        load_flat(self.shared(self.eval_model), state.params)
        self.load_stats(self.eval_model, state.buffers.get("stats"))
        return self.eval_model

    def eavesdropped_model(self, payload: Message, upload: Message) -> nn.Module | None:
        """The client's local model: the broadcast weights plus the uploaded delta."""
        load_flat(self.shared(self.eval_model), payload.vector + upload.vector)
        return self.eval_model

    def describe(self) -> dict[str, float]:
        total = sum(p.numel() for p in self.eval_model.parameters())
        stats = flat_stats(self.stat_buffers(self.eval_model))
        out = {
            "params/total": total,
            "params/uploaded_per_client": len(flat_params(self.shared(self.eval_model))),
        }
        if stats is not None:
            out["params/running_stats_per_client"] = stats.numel()
        return out


def payload_rows(payloads: Sequence[Message]) -> torch.Tensor:
    """The payloads' weights: one vector [d] where every client got the same, else [C, d]."""
    first = payloads[0].vector
    if all(p.vector is first for p in payloads):
        return first
    return torch.stack([p.vector for p in payloads])
