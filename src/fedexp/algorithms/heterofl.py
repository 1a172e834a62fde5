"""HeteroFL (Diao, Ding, Tarokh, ICLR 2021): computation- and communication-efficient federated
learning for heterogeneous clients, by width-scaled sub-models of one global network.

A client of capability rate p receives, trains and returns the sub-model holding the first
ceil(p * width) units of every hidden layer of the global network (`heterofl_slicing`); the
server averages each entry of the global network over the clients whose sub-model holds it
(`heterofl_levels.overlap_mean`; an entry no client of the round holds keeps its value) and
steps as FedAvg does (`server_lr`, `server_momentum`; 1 and 0: the average itself). The global
network is evaluated whole. Parts of the method, as options:

- `scaler`: a hidden layer's output divided by p while a sub-model trains (Sec. 3.2);
- `norm: sbn`: static BatchNorm after each hidden layer (Sec. 3.2): no running statistics while
  clients train; the server queries every client's training data, client by client, for the
  global network's statistics before it is evaluated (the reference code's `stats`: a
  cumulative average over batches of `client.batch_size`, the batches of one sample left out);
  a model's own BatchNorm layers are static likewise;
- `masked_loss`: the logits of the classes a client holds no sample of are set to 0 in its
  cross-entropy (the masking trick; the reference code's `mask`);
- `head_aggregation: held_labels`: a client's head rows of those classes are left out of the
  average (the reference code's `combine`, whatever `mask`).

Levels: `rates` and `proportions`, each client's fixed for the run or drawn each round
(`assignment`, `heterofl_levels`), or `rates: family`: with a model family
(model=cnn_family, mlp_family; or `default_family` where one architecture was chosen) the global
network is the family's largest member and each client keeps the architecture FedHeNN would
give it (`client_arch`, the same draw), trained as the sub-model of the largest rate whose
parameters are at most that architecture's: the same client sends as many parameters in both
methods. With a family and a list of rates the global network is the family's largest member.

Only the sub-model's entries travel, both ways (32-bit floats). Clients keep nothing between
rounds (but, under `assignment: dynamic`, the round's level). A level's clients train one
resident module; on a vmapped cohort a static BatchNorm counts the real samples of a padded
batch alone (`SubModelModule`), so every executor trains the same models. With every client
at rate 1, `norm: none`, `masked_loss: false` and `head_aggregation: all` (or clients holding
every class) HeteroFL is FedAvg with the same `weighting`, bit for bit.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import partial

import torch
from omegaconf import OmegaConf
from torch import nn

from fedexp.algorithms import heterofl_levels as levels_
from fedexp.algorithms import heterofl_slicing as slicing
from fedexp.algorithms.fedavg import FedAvg
from fedexp.algorithms.heterofl_client import (
    WHOLE,
    MaskedModule,
    SubModel,
    SubModelDelta,
    SubModelModule,
)
from fedexp.core.algorithm import BuildContext
from fedexp.core.client import ClientModule
from fedexp.core.cohort import CohortStart, CohortTraining
from fedexp.core.flat import flat_params, load_flat
from fedexp.core.seeding import INIT, client_arch, derive_seed
from fedexp.core.types import ClientResult, ConfigError, Message, RoundContext, ServerState
from fedexp.models.family import family_size

__all__ = ["HeteroFL", "MaskedModule", "SubModel", "SubModelDelta", "SubModelModule"]


class HeteroFL(FedAvg):
    """Width-scaled sub-models of one global network, averaged over their overlap."""

    has_global_model = True
    can_be_eavesdropped = True
    upload_type = SubModelDelta
    aggregator_inputs = ()  # the mean aggregator alone (`check_config`)

    def __init__(
        self,
        ctx: BuildContext,
        rates: list[float] | str,
        proportions: list[float],
        assignment: str,
        default_family: str,
        scaler: bool,
        norm: str,
        masked_loss: bool,
        head_aggregation: str,
        **fedavg_kwargs,
    ):
        rates = rates if isinstance(rates, str) else [float(r) for r in rates]
        levels_.check_options(rates, proportions, assignment, norm, head_aggregation)
        self.scaler, self.sbn, self.masked_loss = bool(scaler), norm == "sbn", bool(masked_loss)
        self.head_aggregation, self.assignment = head_aggregation, assignment
        self.num_clients = num_clients = ctx.data.num_clients
        factory, sizes = self._global_factory(ctx, rates, default_family)
        self.base_factory = factory
        self.input_shape = tuple(ctx.data.input_shape)
        with torch.random.fork_rng(devices=[]):
            self.layers, self.head = slicing.body_layers(factory(), self.input_shape)
        # the clients' levels for the run (None: drawn each round, `assignment: dynamic`)
        self.levels: list[int] | None = None
        if rates == "family":  # each client's FedHeNN architecture, at its parameter budget
            self.rates = [slicing.matched_rate(self.layers, self.head, n) for n in sizes]
            self.proportions = [1.0] * len(sizes)
            self.levels = [client_arch(ctx.seed, c, len(sizes)) for c in range(num_clients)]
        else:
            self.rates, self.proportions = list(rates), [float(p) for p in proportions]
            if assignment == "fixed":
                self.levels = levels_.assign_levels(ctx.seed, num_clients, self.proportions)
        super().__init__(ctx, **fedavg_kwargs)  # the global network: build_model
        self.level_modules = [self._level_module(rate) for rate in self.rates]
        self._level_of_module = {id(m): i for i, m in enumerate(self.level_modules)}
        self.dim = sum(p.numel() for p in self.eval_model.parameters())
        self.index = [slicing.positions(self.eval_model, m.model) for m in self.level_modules]
        self.whole = [len(ix) == self.dim for ix in self.index]  # the rate-1 level: no slicing
        self.level_cover = []
        for ix in self.index:
            cover = torch.zeros(self.dim, dtype=torch.bool)
            cover[ix] = True
            self.level_cover.append(cover.to(self.device))
        self.index = [ix.to(self.device) for ix in self.index]
        self.head_class = slicing.head_classes(self.eval_model).to(self.device)
        self.norms = [m for m in self.eval_model.modules() if isinstance(m, slicing.NORMS)]
        self.shadow_levels: dict[int, int] = {}  # the audit's shadows: their target's level
        self._held: dict[int, torch.Tensor] = {}
        self._stats_of: torch.Tensor | None = None

    # ---- the global network and the levels -----------------------------------------------------
    @classmethod
    def check_config(cls, cfg) -> None:
        """Bad options and an aggregator other than the mean, before any data is loaded."""
        node = cfg.algorithm
        levels_.check_options(
            node.rates, node.proportions, node.assignment, node.norm, node.head_aggregation
        )
        levels_.check_aggregator(OmegaConf.select(cfg, "aggregator._target_"))

    @staticmethod
    def _global_factory(ctx: BuildContext, rates, default_family: str):
        """(a factory of the model the global network is made from, the parameter counts of the
        family's members or None). A family gives its largest member."""
        factory = ctx.model_factory
        if rates == "family" and family_size(factory) is None:
            if ctx.family is None:
                raise ConfigError("algorithm.rates: family needs a model family; none is built")
            factory = ctx.family(default_family)
        num_archs = family_size(factory)
        if num_archs is None:
            return factory, None
        with torch.random.fork_rng(devices=[]):
            sizes = [sum(p.numel() for p in factory(arch=a).parameters()) for a in range(num_archs)]
        largest = max(range(num_archs), key=lambda a: (sizes[a], a))
        return partial(factory, arch=largest), sizes

    def _specs(self, rate: float, layers=None, head=None) -> list[slicing.Spec]:
        layers, head = (self.layers, self.head) if layers is None else (layers, head)
        return slicing.plan(layers, head, rate, scaler=self.scaler, sbn=self.sbn)

    def build_model(self) -> nn.Module:
        """The global network (BatchNorm with running statistics, for evaluation)."""
        return slicing.build(self._specs(1.0), static=False).to(self.device)

    def _level_module(self, rate: float) -> ClientModule:
        model = slicing.build(self._specs(rate), static=True).to(self.device)
        kind = MaskedModule if self.masked_loss else SubModelModule
        return kind(model, self.ctx.client)

    def stat_buffers(self, model: nn.Module) -> list[torch.Tensor]:
        return []  # no running statistics travel: sBN's are the server's, made at evaluation

    def level_of(self, client_id: int) -> int | None:
        """The client's level (under `assignment: dynamic` the one `configure_round` drew for
        the round and the client keeps in the store; None before any); an id beyond the
        federation: its shadow's target's, else None."""
        if not 0 <= client_id < self.num_clients:
            return self.shadow_levels.get(client_id)
        if self.levels is not None:
            return self.levels[client_id]
        drawn = self.store.get(client_id)
        return None if drawn is None else int(drawn)

    def held(self, client_id: int, module: ClientModule | None = None) -> torch.Tensor:
        """The classes the client holds a training sample of (bool [num_classes]); an id beyond
        the federation: those of the data it trains on now, else every class."""
        classes = self.head.out_features
        if 0 <= client_id < self.num_clients:
            if client_id not in self._held:
                labels = self.ctx.data.train(client_id)[1]
                self._held[client_id] = levels_.held_labels(labels, classes).to(self.device)
            return self._held[client_id]
        data = None if module is None else module.local_data
        if data is None:
            return torch.ones(classes, dtype=torch.bool, device=self.device)
        return levels_.held_labels(data[1], classes).to(self.device)

    # ---- server --------------------------------------------------------------------------------
    def init_state(self) -> ServerState:
        """The global network from the model as FedAvg initialises it (the same seed, the same
        values; a BatchNorm HeteroFL puts in starts at weight 1, bias 0)."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(derive_seed(self.ctx.seed, INIT))
            base = self.base_factory()
        layers, head = slicing.body_layers(base, self.input_shape)
        net = slicing.build(self._specs(1.0, layers, head), static=False, copy_values=True)
        params = flat_params(list(net.parameters())).to(self.device)
        load_flat(self.shared(self.eval_model), params)
        self._stats_of = None
        return ServerState(params=params)

    def configure_round(self, state: ServerState, ctx: RoundContext) -> Mapping[int, Message]:
        """Each client its level's sub-model (one payload object per level). Under `assignment:
        dynamic` each client's level is drawn for the round first and kept in the client store,
        where the client's training reads it (whichever process trains it)."""
        if self.levels is None:
            for cid in ctx.client_ids:
                if 0 <= cid < self.num_clients:
                    level = levels_.dynamic_level(self.ctx.seed, ctx.round, cid, self.proportions)
                    self.store.put(cid, torch.tensor(level))
        made: dict[int | None, SubModel] = {}
        out = {}
        for cid in ctx.client_ids:
            level = self.level_of(cid)
            if level not in made:
                if level is None or self.whole[level]:
                    made[level] = SubModel(state.params, WHOLE if level is None else level)
                else:
                    made[level] = SubModel(state.params[self.index[level]], level)
            out[cid] = made[level]
        return out

    def aggregate(
        self, state: ServerState, results: Sequence[ClientResult], ctx: RoundContext
    ) -> tuple[ServerState, dict[str, float]]:
        ids = list(results.client_ids)
        updates = results.uploads().vector  # [K, d], the global network's coordinates
        held = None
        if self.head_aggregation == "held_labels":
            held = torch.stack([self.held(c) for c in ids])
        levels = [self.level_of(c) for c in ids]
        cover = levels_.coverage(levels, self.level_cover, held, self.head_class)
        step = levels_.overlap_mean(updates, cover, self.client_weights(results))
        metrics = {
            "heterofl/updated_fraction": float(cover.any(0).to(torch.float32).mean()),
            "heterofl/mean_rate": sum(self.rates[v] for v in levels) / len(levels),
        }
        return self.server_step(state, step, results, ctx.round), metrics

    # ---- client --------------------------------------------------------------------------------
    def client_module(self, client_id: int) -> ClientModule:
        level = self.level_of(client_id)
        top = max(range(len(self.rates)), key=lambda i: self.rates[i])
        return self.level_modules[top if level is None else level]

    def _fit(self, module: ClientModule, payloads: Sequence[SubModel]) -> list[SubModel]:
        """The payloads as the module's level has them (a whole network cut to its sub-model)."""
        level = self._level_of_module[id(module)]
        out, cut = [], {}
        for p in payloads:
            if p.level == level:
                out.append(p)
                continue
            if p.level != WHOLE:
                raise ValueError(f"a payload of level {p.level} for a module of level {level}")
            if id(p) not in cut:
                cut[id(p)] = SubModel(p.values[self.index[level]], level)
            out.append(cut[id(p)])
        return out

    def begin(self, module: ClientModule, client_ids, payloads, stats) -> CohortStart:
        start = super().begin(module, client_ids, self._fit(module, payloads), stats)
        if self.masked_loss:
            start.attrs["label_mask"] = torch.stack([self.held(c, module) for c in client_ids])
        return start

    def end(
        self,
        module: ClientModule,
        payloads: Sequence[Message],
        params: Mapping[str, torch.Tensor],
        training: CohortTraining,
    ) -> Message:
        payloads = self._fit(module, payloads)
        sub = super().end(module, payloads, params, training).vector  # [C, d_l]
        level = payloads[0].level
        if self.whole[level]:
            values = sub
        else:
            values = sub.new_zeros(sub.shape[0], self.dim)
            values[:, self.index[level]] = sub
        count = torch.full((sub.shape[0],), sub.shape[1], dtype=torch.int64)
        return SubModelDelta(values, count, torch.full_like(count, level))

    # ---- evaluation ----------------------------------------------------------------------------
    def global_model(self, state: ServerState) -> nn.Module | None:
        load_flat(self.shared(self.eval_model), state.params)
        if self.norms and self._stats_of is not state.params:
            self._static_statistics()
            self._stats_of = state.params
        return self.eval_model

    @torch.no_grad()
    def _static_statistics(self) -> None:
        """sBN: the global network's BatchNorm statistics, a cumulative average over every
        client's training data in batches of `client.batch_size`, client after client."""
        model, data, size = self.eval_model, self.ctx.data, self.ctx.client.batch_size
        for m in self.norms:
            m.reset_running_stats()
        model.train()
        for cid in range(data.num_clients):
            x = data.train(cid)[0]
            for i in range(0, len(x), size):
                if len(x[i : i + size]) > 1:  # BatchNorm has no batch statistics of one sample
                    model(x[i : i + size])
        model.eval()

    def on_resume(self, state: ServerState) -> None:
        self._stats_of = None

    def eavesdropped_model(self, payload: Message, upload: Message) -> nn.Module | None:
        """The client's sub-model: what it received plus its upload's entries (the level's
        resident module, reused by the next call)."""
        level = int(upload.level)
        module = self.level_modules[level]
        (received,) = self._fit(module, [payload])
        load_flat(self.shared(module.model), received.values + upload.values[self.index[level]])
        return module.model

    def prepare_shadow(self, shadow_id: int, client_id: int) -> None:
        """A shadow of client `client_id` trains its level's sub-model."""
        self.shadow_levels[shadow_id] = self.level_of(client_id)

    def describe(self) -> dict[str, float]:
        sizes = [len(ix) for ix in self.index]
        shares = [p / sum(self.proportions) for p in self.proportions]
        if self.levels is not None:
            counts = torch.bincount(torch.tensor(self.levels), minlength=len(self.rates))
            shares = [int(c) / max(self.num_clients, 1) for c in counts]
        out: dict[str, float] = {
            "params/total": self.dim,
            "params/uploaded_per_client": sum(s * n for s, n in zip(shares, sizes)),
        }
        for i, rate in enumerate(self.rates):
            out[f"heterofl/level{i}_rate"] = rate
            out[f"heterofl/level{i}_share"] = shares[i]
            out[f"heterofl/level{i}_params"] = sizes[i]
        return out

    def run_warnings(self, rounds: int) -> list[str]:
        found = []
        if max(self.rates) < 1.0:
            found.append(
                f"algorithm.rates: no client trains the whole global network (largest rate "
                f"{max(self.rates)}): its units beyond keep their initial values"
            )
        shares = self.describe()
        empty = [r for i, r in enumerate(self.rates) if shares[f"heterofl/level{i}_share"] == 0]
        if empty:
            found.append(
                f"algorithm.proportions: no client has rate {', '.join(map(str, empty))} "
                f"among num_clients={self.num_clients}"
            )
        return found
