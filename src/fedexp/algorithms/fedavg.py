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

from fedexp.core.algorithm import Algorithm, BuildContext
from fedexp.core.client import ClientModule
from fedexp.core.cohort import (
    CohortStart,
    CohortTraining,
    flat_rows,
    is_cohort,
    result_samples,
)
from fedexp.core.flat import flat_delta, flat_params, load_flat, named_views, share_model_storage
from fedexp.core.local import LocalTraining
from fedexp.core.seeding import INIT, derive_seed
from fedexp.core.types import ClientResult, ConfigError, Message, RoundContext, ServerState, Weights
from fedexp.models.running_stats import flat_stats, load_stats, norm_layers, running_buffers


class FedAvg(Algorithm):
    """Federated averaging over the `shared` parameters (all of them here)."""

    has_global_model = True
    can_be_eavesdropped = True

    upload_type = Weights

    def __init__(
        self,
        ctx: BuildContext,
        weighting: str,
        server_lr: float,
        server_momentum: float,
    ):
        super().__init__(ctx)
        if weighting not in ("samples", "uniform"):
            raise ConfigError(f"algorithm.weighting: must be samples or uniform, got {weighting!r}")
        if server_lr <= 0:
            raise ConfigError(f"algorithm.server_lr: must be > 0, got {server_lr}")
        self.weighting = weighting
        self.server_lr = server_lr
        self.server_momentum = server_momentum
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
        # kept for the round's `client_begin` calls (payload classes carry the weights only)
        self._round_stats = state.buffers.get("stats")
        return self._round_stats

    def with_averaged_stats(
        self, state: ServerState, results: Sequence[ClientResult]
    ) -> ServerState:
        """`state` with its running statistics replaced by the clients' weighted mean (the
        clients' weights p_k). Every `aggregate` of this family ends with it."""
        if is_cohort(results):  # trained at once: no running statistics travel
            return state
        stats = [r.stats for r in results]
        if not stats or any(s is None for s in stats):
            return state
        weights = self.client_weights(results).to(torch.float32)
        mean = (weights / weights.sum()) @ torch.stack(stats).to(weights.device)
        return ServerState(state.params, {**state.buffers, "stats": mean})

    def configure_round(self, state: ServerState, ctx: RoundContext) -> Mapping[int, Message]:
        payload = Weights(state.params)
        return {cid: payload for cid in ctx.client_ids}

    def client_weights(self, results: Sequence[ClientResult]) -> torch.Tensor:
        if self.weighting == "uniform":
            return torch.ones(len(results), device=self.device)
        return torch.tensor([float(n) for n in result_samples(results)], device=self.device)

    def stack_uploads(self, results: Sequence[ClientResult]) -> torch.Tensor:
        """The round's uploads as dense rows [n, d] for the aggregator."""
        if is_cohort(results):
            return results.upload.vector
        return torch.stack([r.upload.vector for r in results])

    def aggregate(
        self, state: ServerState, results: Sequence[ClientResult], ctx: RoundContext
    ) -> tuple[ServerState, dict[str, float]]:
        updates = self.stack_uploads(results)
        step = self.ctx.aggregator(
            updates, self.client_weights(results), num_malicious=ctx.num_malicious
        )
        buffers = dict(state.buffers)  # the caller's state stays as it was
        if self.server_momentum:
            buf = buffers.get("momentum")
            step = step if buf is None else self.server_momentum * buf + step
            buffers["momentum"] = step
        step = step if self.server_lr == 1.0 else self.server_lr * step  # x * 1.0 == x
        return self.with_averaged_stats(ServerState(state.params + step, buffers), results), {}

    # ---- client --------------------------------------------------------------------------------
    def client_module(self, client_id: int) -> ClientModule:
        return self.module

    def client_begin(self, module: ClientModule, client_id: int, payload: Message) -> None:
        load_flat(self.shared(module.model), payload.vector)
        # the global statistics, not those the previous client left in the resident module
        self.load_stats(module.model, self.__dict__.get("_round_stats"))

    # ---- the cohort at once (the vectorized executor) -------------------------------------------
    def cohort_begin(
        self, module: ClientModule, client_ids: Sequence[int], payloads: Sequence[Message]
    ) -> CohortStart | None:
        if not self.batched_hooks(FedAvg) or self.__dict__.get("_round_stats") is not None:
            return None
        return CohortStart(self.cohort_params(module, payloads))

    def cohort_params(
        self, module: ClientModule, payloads: Sequence[Message], own=None
    ) -> dict[str, torch.Tensor]:
        """Every client's starting parameters and buffers [C, ...] by name: the payloads'
        weights for the shared parameters; `own` (name -> [C, ...]) for those kept on the
        clients; the module's for the rest (as the resident module holds them)."""
        model, count = module.model, len(payloads)
        vector = payload_rows(payloads)
        shared = self.shared(model)
        names = {id(p): n for n, p in module.named_parameters()}
        out = {}
        if vector.dim() == 1:  # one broadcast for every client
            for p, piece in zip(shared, vector.split([p.numel() for p in shared])):
                out[names[id(p)]] = piece.view(p.shape).expand(count, *p.shape)
        else:
            out.update({f"model.{n}": v for n, v in named_views(vector, model, shared).items()})
        out.update(own or {})
        for n, t in [*module.named_parameters(), *module.named_buffers()]:
            if n not in out:
                out[n] = t.detach().expand(count, *t.shape)
        return out

    def payload_views(self, module: ClientModule, vector: torch.Tensor) -> list[torch.Tensor]:
        """`vector` ([d] or [C, d]) as views shaped like the shared parameters ([C, ...])."""
        shared = self.shared(module.model)
        pieces = vector.split([p.numel() for p in shared], dim=-1)
        return [c.view(*vector.shape[:-1], *p.shape) for p, c in zip(shared, pieces)]

    def cohort_end(
        self,
        module: ClientModule,
        payloads: Sequence[Message],
        params: Mapping[str, torch.Tensor],
        training: CohortTraining,
    ) -> Message:
        return Weights(self.cohort_flat(module, params) - payload_rows(payloads))

    def cohort_flat(self, module: ClientModule, params: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """The shared parameters of every client, flat [C, d] (`flat_params` per row)."""
        return flat_rows(module, params, self.shared(module.model))

    def client_stats(self, module: ClientModule) -> torch.Tensor | None:
        return flat_stats(self.stat_buffers(module.model))

    def load_stats(self, model: nn.Module, stats: torch.Tensor | None) -> None:
        if stats is not None:
            load_stats(self.stat_buffers(model), stats)

    def client_end(
        self, module: ClientModule, client_id: int, payload: Message, training: LocalTraining
    ) -> Message:
        return Weights(flat_delta(self.shared(module.model), payload.vector))

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
