"""FRL: Federated Rank Learning (Mozaffari, Shejwalkar, Houmansadr, USENIX Security 2023).

Clients never train or send weights. The server draws one seed; the server and every client
rebuild the same supermask network from it (frozen weights θ^w and initial scores θ^s), so only
rankings travel. The server keeps S0, each layer's initial score values sorted by the rank key.

Round: the server sends the global ranking R_g (per layer). A client writes S0 back along R_g
(θ^s[R_g[i]] = S0[i], so a higher rank means a larger key), trains the scores for E epochs on its
data, and uploads R_u = argsort(key(θ^s)) per layer. The aggregator (`rank_vote`) sums each edge's
positions over the clients' rankings and sorts: R_g(t+1) = argsort(sums). The global model is the
supernetwork with R_g's mask; weights and S0 never change.

The reference code's learning-rate rules, off by default (`FRLClientModule`): `round_lr_decay`
γ gives round t the client lr `client.lr`·γ^(t−1) (its `lr·lrdc**e`, e = t − 1 its 0-based
round), and `local_lr_schedule: cosine` anneals it over the local epochs as its
`CosineAnnealingLR(T_max=E)` stepped once an epoch: epoch e = 0..E−1 trains at
lr_t·(1 + cos(π e / E)) / 2, one optimizer (its momentum) carried over the epochs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch
from torch import nn

from fedexp.core.algorithm import Algorithm, BuildContext
from fedexp.core.client import ClientModule, Phase, make_optimizer
from fedexp.core.cohort import CohortStart
from fedexp.core.local import ClientConfig
from fedexp.core.seeding import INIT, derive_seed
from fedexp.core.types import ClientResult, ConfigError, Message, Ranking, RoundContext, ServerState
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

LR_SCHEDULES = ("constant", "cosine")


def round_lr(lr: float, decay: float, round_idx: int) -> float:
    """The client lr of round `round_idx` (1-based): lr·decay^(round_idx − 1); the reference
    code's lr·lrdc**e at its 0-based round e = round_idx − 1."""
    return lr * decay ** (round_idx - 1)


def cosine_factor(epoch: int, epochs: int) -> float:
    """The share of the round's lr that local epoch `epoch` (0-based) of `epochs` trains at:
    (1 + cos(π·epoch/epochs)) / 2, torch's `CosineAnnealingLR(T_max=epochs)` (eta_min 0) stepped
    once an epoch, as the reference code."""
    return (1 + math.cos(math.pi * epoch / epochs)) / 2


class FRLClientModule(ClientModule):
    """FRL's client: the task loss over the scores, with the reference code's lr rules.

    `round_idx` is set by `FRL.configure_round` every round, so the lr is a function of the
    round (exact on resume). With `local_lr_schedule: cosine` each local epoch is a phase of its
    own (`epoch1` .. `epochE`) trained at its cosine lr, and the optimizer made for the first
    epoch is the one of the later epochs (its lr rewritten): SGD's momentum carries over the
    epochs, as the reference's one optimizer and its scheduler. Both rules off (decay 1,
    constant), training is `ClientModule`'s exactly.
    """

    def __init__(self, model: nn.Module, client: ClientConfig, decay: float, schedule: str):
        super().__init__(model, client)
        self.round_lr_decay, self.local_lr_schedule = decay, schedule
        self.round_idx = 1
        self._epochs = {f"epoch{e + 1}": e for e in range(client.local_epochs)}
        self._optimizer: torch.optim.Optimizer | None = None

    @property
    def lr_rules(self) -> bool:
        return self.round_lr_decay != 1.0 or self.local_lr_schedule != "constant"

    def lr_at(self, round_idx: int, epoch: int = 0) -> float:
        """The lr of local epoch `epoch` (0-based) in round `round_idx` (1-based), from the
        round's client lr (`client.lr_at`: `client.lr` under the constant schedule)."""
        lr = round_lr(self.client.lr_at(round_idx), self.round_lr_decay, round_idx)
        if self.local_lr_schedule == "cosine":
            lr *= cosine_factor(epoch, self.client.local_epochs)
        return lr

    def phases(self) -> list[Phase]:
        if self.local_lr_schedule == "constant":
            return super().phases()
        params = self.model_params()
        return [Phase(name, 1, params) for name in self._epochs]

    def configure_optimizers(self) -> torch.optim.Optimizer:
        if not self.lr_rules:
            return super().configure_optimizers()
        name, kwargs = self._optimizer_spec
        epoch = self._epochs.get(self.current_phase, 0)
        lr = self.lr_at(self.round_idx, epoch)
        if epoch > 0 and self._optimizer is not None:  # the first epoch's optimizer, carried on
            for group in self._optimizer.param_groups:
                group["lr"] = lr
            return self._optimizer
        optimizer = make_optimizer(self._phase_params, (name, {**kwargs, "lr": lr}))
        if self.local_lr_schedule == "cosine":
            self._optimizer = optimizer
        return optimizer


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
        round_lr_decay: float,
        local_lr_schedule: str,
    ):
        super().__init__(ctx)
        if rank_key not in RANK_KEYS:
            raise ConfigError(f"algorithm.rank_key: must be one of {RANK_KEYS}, got {rank_key!r}")
        self.k, self.weight_init, self.rank_key = k, weight_init, rank_key
        self.round_lr_decay, self.local_lr_schedule = check_lr_rules(
            round_lr_decay, local_lr_schedule, ctx.client
        )
        # the vectorized executor restarts the optimizer's state at every phase: the cosine
        # schedule's epochs (phases) share one optimizer, so it trains client by client
        self.vectorizable = self.local_lr_schedule == "constant"
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
        self.module = FRLClientModule(
            client_model, self.ctx.client, self.round_lr_decay, self.local_lr_schedule
        )
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
        self.module.round_idx = ctx.round  # the round's client lr (`FRLClientModule.lr_at`)
        payload = Ranking(tuple(state.buffers["global_ranking"]))
        return {cid: payload for cid in ctx.client_ids}

    def round_lrs(self, round_idx: int) -> dict[str, float]:
        """The round's client lr with the reference code's decay (its first local epoch's)."""
        if self.ctx.client.optimizer == "module":
            return {}
        return {"train/client_lr": self.module.lr_at(round_idx)}

    def aggregate(
        self, state: ServerState, results: Sequence[ClientResult], ctx: RoundContext
    ) -> tuple[ServerState, dict[str, float]]:
        votes = torch.ones(len(results), device=self.device)  # one client, one vote
        bad = ctx.num_malicious
        old = state.buffers["global_ranking"]
        new = [
            self.ctx.aggregator(results.upload_rows("layers", i), votes, bad)
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

    def begin(self, module: ClientModule, client_ids, payloads, stats) -> CohortStart:
        """Each client writes S0 along the global ranking it received (one set of scores,
        shared, where every client received the same)."""
        count = len(client_ids)
        names = {id(p): n for n, p in module.named_parameters()}
        same = all(p is payloads[0] for p in payloads)
        params = {}
        for k, (layer, s0) in enumerate(zip(supermask_layers(module.model), self.client_s0)):
            shape = layer.scores.shape
            rows = [
                torch.empty_like(layer.scores).view(-1).index_put((p.layers[k],), s0).view(shape)
                for p in (payloads[:1] if same else payloads)
            ]
            scores = rows[0].expand(count, *shape) if same else torch.stack(rows)
            params[names[id(layer.scores)]] = scores
        for n, t in [*module.named_parameters(), *module.named_buffers()]:
            if n not in params:
                params[n] = t.detach().expand(count, *t.shape)
        return CohortStart(params)

    def end(self, module: ClientModule, payloads, params, training) -> Message:
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


def check_lr_rules(decay, schedule, client: ClientConfig) -> tuple[float, str]:
    """`algorithm.round_lr_decay` (a float in (0, 1]) and `algorithm.local_lr_schedule` (one of
    LR_SCHEDULES), checked; neither applies to `client.optimizer=module`."""
    if isinstance(decay, bool) or not isinstance(decay, (int, float)) or not 0 < decay <= 1:
        raise ConfigError(f"algorithm.round_lr_decay: must be a number in (0, 1], got {decay!r}")
    if schedule not in LR_SCHEDULES:
        raise ConfigError(
            f"algorithm.local_lr_schedule: must be one of {LR_SCHEDULES}, got {schedule!r}"
        )
    if client.optimizer == "module" and (decay != 1 or schedule != "constant"):
        raise ConfigError(
            "algorithm.round_lr_decay / local_lr_schedule: set the lr of client.optimizer=module "
            "in the model's configure_optimizers"
        )
    return float(decay), schedule
