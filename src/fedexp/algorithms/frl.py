"""FRL: Federated Rank Learning (Mozaffari, Shejwalkar, Houmansadr, USENIX Security 2023).

Clients never train or send weights. The server draws one seed; the server and every client
rebuild the same supermask network from it (frozen weights θ^w and initial scores θ^s), so only
rankings travel. The server keeps S0, each layer's initial score values sorted by the rank key.

Round: the server sends the global ranking R_g (per layer). A client writes S0 back along R_g
(θ^s[R_g[i]] = S0[i], so a higher rank means a larger key), trains the scores for E epochs on its
data, and uploads R_u = argsort(key(θ^s)) per layer. The aggregator (`rank_vote`) sums each edge's
positions over the clients' rankings and sorts: R_g(t+1) = argsort(sums). The global model is the
supernetwork with R_g's mask; weights and S0 never change.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import nn

from fedexp.core.algorithm import Algorithm, BuildContext
from fedexp.core.client import ClientModule
from fedexp.core.cohort import CohortStart, stacked_field
from fedexp.core.local import LocalTraining
from fedexp.core.messages import Ranking
from fedexp.core.seeding import INIT, derive_seed
from fedexp.core.types import ClientResult, ConfigError, Message, RoundContext, ServerState
from fedexp.models.supermask import (
    RANK_KEYS,
    num_kept,
    ranking,
    rankings,
    sorted_scores,
    supermask_layers,
    to_supermask,
    write_ranking,
)


class FRL(Algorithm):
    """Federated rank learning over a supermask twin of the configured model."""

    has_global_model = True
    can_be_eavesdropped = True

    upload_type = Ranking

    def __init__(
        self,
        ctx: BuildContext,
        k: float,
        weight_init: str,
        rank_key: str,
    ):
        super().__init__(ctx)
        if rank_key not in RANK_KEYS:
            raise ConfigError(f"algorithm.rank_key: must be one of {RANK_KEYS}, got {rank_key!r}")
        self.k, self.weight_init, self.rank_key = k, weight_init, rank_key
        self.model_seed = derive_seed(ctx.seed, INIT)
        self._built_seed: int | None = None
        self._build(self.model_seed)

    # ---- the seeded network ----------------------------------------------------------------
    def build_model(self, seed: int) -> nn.Module:
        """θ^w and the initial θ^s rebuilt from `seed`: identical wherever it is called."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = to_supermask(self.ctx.model_factory(), self.k, self.weight_init)
        return model.to(self.device)

    def _build(self, seed: int) -> None:
        """Caches rebuilt from the state's seed: the clients' resident copy and their S0, and the
        server's evaluation copy."""
        if self._built_seed == seed:
            return
        client_model = self.build_model(seed)
        self.module = ClientModule(client_model, self.ctx.client)
        self.client_s0 = [
            sorted_scores(layer.scores, self.rank_key) for layer in supermask_layers(client_model)
        ]
        self.eval_model = self.build_model(seed)
        self._built_seed = seed

    # ---- server ----------------------------------------------------------------------------
    def init_state(self) -> ServerState:
        self._build(self.model_seed)
        layers = supermask_layers(self.eval_model)
        return ServerState(
            params=None,
            buffers={
                "model_seed": self.model_seed,
                "initial_sorted_scores": [sorted_scores(m.scores, self.rank_key) for m in layers],
                "global_ranking": [ranking(m.scores, self.rank_key) for m in layers],
            },
        )

    def configure_round(self, state: ServerState, ctx: RoundContext) -> Mapping[int, Message]:
        self._build(state.buffers["model_seed"])
        payload = Ranking(tuple(state.buffers["global_ranking"]))
        return {cid: payload for cid in ctx.client_ids}

    def aggregate(
        self, state: ServerState, results: Sequence[ClientResult], ctx: RoundContext
    ) -> tuple[ServerState, dict[str, float]]:
        votes = torch.ones(len(results), device=self.device)  # one client, one vote
        bad = ctx.num_malicious
        old = state.buffers["global_ranking"]
        new = [
            self.ctx.aggregator(stacked_field(results, "layers", i), votes, bad)
            for i in range(len(old))
        ]
        metrics = {"frl/mask_change": self.mask_change(old, new, state)}
        return ServerState(state.params, {**state.buffers, "global_ranking": new}), metrics

    def kept_edges(self, edge_ranking: torch.Tensor, s0: torch.Tensor) -> torch.Tensor:
        """Edge ids the mask keeps once S0 is written along `edge_ranking` (top k of |S0|)."""
        positions = torch.topk(s0.abs(), num_kept(s0.numel(), self.k)).indices
        return edge_ranking[positions]

    def mask_change(self, old, new, state: ServerState) -> float:
        """Fraction of the kept edges that are new this round (0 when the mask is settled)."""
        changed = kept = 0
        for r_old, r_new, s0 in zip(old, new, state.buffers["initial_sorted_scores"]):
            before = torch.zeros(s0.numel(), dtype=torch.bool, device=s0.device)
            before[self.kept_edges(r_old, s0)] = True
            after = self.kept_edges(r_new, s0)
            changed += int((~before[after]).sum())
            kept += after.numel()
        return changed / max(kept, 1)

    # ---- client ----------------------------------------------------------------------------
    def client_module(self, client_id: int) -> ClientModule:
        return self.module

    def client_begin(self, module: ClientModule, client_id: int, payload: Message) -> None:
        for layer, edge_ranking, s0 in zip(
            supermask_layers(module.model), payload.layers, self.client_s0
        ):
            write_ranking(layer.scores, edge_ranking, s0)

    def client_end(
        self, module: ClientModule, client_id: int, payload: Message, training: LocalTraining
    ) -> Message:
        layers = supermask_layers(module.model)
        return Ranking(tuple(ranking(layer.scores, self.rank_key) for layer in layers))

    # ---- the cohort at once -----------------------------------------------------------------
    def cohort_begin(self, module: ClientModule, client_ids, payloads) -> CohortStart | None:
        """Every client writes S0 along the same global ranking: one set of scores, shared."""
        if not self.batched_hooks(FRL):
            return None
        first = payloads[0]
        if any(p is not first for p in payloads):
            return None
        count = len(client_ids)
        names = {id(p): n for n, p in module.named_parameters()}
        params = {}
        for layer, edge_ranking, s0 in zip(
            supermask_layers(module.model), first.layers, self.client_s0
        ):
            scores = torch.empty_like(layer.scores).view(-1).index_put((edge_ranking,), s0)
            params[names[id(layer.scores)]] = scores.view(layer.scores.shape).expand(
                count, *layer.scores.shape
            )
        for n, t in [*module.named_parameters(), *module.named_buffers()]:
            if n not in params:
                params[n] = t.detach().expand(count, *t.shape)
        return CohortStart(params)

    def cohort_end(self, module: ClientModule, payloads, params, training) -> Message:
        names = {id(p): n for n, p in module.named_parameters()}
        return Ranking(
            tuple(
                rankings(params[names[id(layer.scores)]], self.rank_key)
                for layer in supermask_layers(module.model)
            )
        )

    # ---- evaluation ------------------------------------------------------------------------
    def global_model(self, state: ServerState) -> nn.Module | None:
        self._build(state.buffers["model_seed"])
        for layer, edge_ranking, s0 in zip(
            supermask_layers(self.eval_model),
            state.buffers["global_ranking"],
            state.buffers["initial_sorted_scores"],
        ):
            write_ranking(layer.scores, edge_ranking, s0)
        return self.eval_model

    def eavesdropped_model(self, payload: Message, upload: Message) -> nn.Module | None:
        """The client's own network: anyone with the broadcast seed rebuilds θ^w and S0, and S0
        written along the uploaded ranking gives the client's mask exactly (only the order of
        the scores matters)."""
        layers = supermask_layers(self.eval_model)
        for layer, edge_ranking, s0 in zip(layers, upload.layers, self.client_s0):
            write_ranking(layer.scores, edge_ranking, s0)
        return self.eval_model

    def describe(self) -> dict[str, float]:
        layers = supermask_layers(self.eval_model)
        return {
            "params/total": sum(m.weight.numel() for m in layers),
            "params/kept": sum(num_kept(m.weight.numel(), self.k) for m in layers),
            "frl/num_layers": len(layers),
        }
