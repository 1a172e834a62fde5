"""FedDF (Lin, Kong, Stich, Jaggi, NeurIPS 2020, "Ensemble Distillation for Robust Model Fusion
in Federated Learning"): the server fuses the received models by distilling their ensemble on
unlabelled data.

Each round (the paper's Algorithm 1; Algorithm 3 for heterogeneous models): the sampled clients
train the model of their architecture group from the group's current model (FedAvg's client
half, `client.*`) and upload it; the server

1. averages the uploads of each architecture group (FedAvg within the group: the student's
   start, x_t^P), and
2. for every group trains that start for `distill_steps` steps on unlabelled server data (the
   server pool, `partition.server_pool`; its labels are not read) towards the ensemble of all
   the round's received models: KL(softmax(t / T) || softmax(s / T)) averaged over the batch,
   t the mean of the received models' logits (the reference code's `avg_logits`; its
   `F.kl_div(..., reduction="batchmean")`, no T^2), with Adam at `distill_lr` annealed by a cosine
   over `distill_steps` (the reference code's CosineAnnealingLR, stepped every batch), gradients
   clipped to norm `distill_clip_norm` (its 5), batches of `distill_batch_size` (its 128) drawn
   by reshuffled passes over the pool.

Early stopping (the reference code's, on validation data): every `early_stop_every` steps (and at
the last) the student is validated, and distillation stops once `early_stop_patience` steps have
passed without an improvement; the fused model is the best validated one. The server holds no
labelled data here, so the validation is unlabelled: the distillation loss on a held-out part of
the pool (`val_fraction` of it, drawn once from the seed), which the student never trains on.
`early_stop_patience: null` distils all `distill_steps` on the whole pool.

Groups: one architecture (FedDF's homogeneous setting) or a model family (each client its
architecture from `fedexp.core.seeding.client_arch`; `default_family` draws one for a
single-architecture model), each group starting from FedAvg's initial model of its
architecture. Every group is distilled every round, from its previous model where none of its
clients came. With one group and `distill_steps: 0` this is FedAvg exactly. What travels is
FedAvg's: each client receives its group's model and uploads its update. Evaluation: with one
group, the global model (as FedAvg); with several, each client's group model on its own test
split (personal metrics, as FedHeNN's heterogeneous clients are compared).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial

import numpy as np
import torch
from omegaconf import OmegaConf
from torch import nn

from fedexp.algorithms.distillation import check_pool, logits_of, pool_size, with_family
from fedexp.algorithms.fedavg import CONSTANT_SERVER_LR, FedAvg
from fedexp.algorithms.feddf_fusion import DistillOptions, distil
from fedexp.core.algorithm import Algorithm, BuildContext
from fedexp.core.client import ClientModule
from fedexp.core.cohort import CohortStart, CohortTraining
from fedexp.core.flat import flat_params, load_flat
from fedexp.core.seeding import client_arch, derive_seed
from fedexp.core.types import ClientResult, ConfigError, Message, RoundContext, ServerState, Weights
from fedexp.models.family import family_size
from fedexp.models.running_stats import flat_stats

SPLIT_STREAM = 79  # derive_seed tag of the pool's held-out validation part
DISTIL_STREAM = 83  # a group's distillation batches in a round
NO_ATTACK = "fedexp.attacks.NoAttack"


@dataclass(frozen=True)
class GroupWeights(Weights):
    """An architecture group's model, sent to its clients; `arch` names the group."""

    arch: int = 0


def _heterogeneous(cfg) -> bool:
    family = OmegaConf.select(cfg, "model.num_archs", default=None) is not None
    return family or OmegaConf.select(cfg, "algorithm.default_family", default=None) is not None


def _check_config(cfg) -> None:
    """A server pool to distil on (before any data is loaded); an attack only on one group."""
    what = "FedDF distils the received models' ensemble on unlabelled inputs"
    check_pool(int(OmegaConf.select(cfg, "partition.server_pool", default=0)), 2, what)
    attack = OmegaConf.select(cfg, "attack._target_", default=NO_ATTACK)
    if attack != NO_ATTACK and _heterogeneous(cfg):
        raise ConfigError(
            "attack: FedDF's uploads differ in length across architecture groups; attacks need "
            "one architecture (a single model and algorithm.default_family=null)"
        )


class FedDF(Algorithm):
    """FedAvg within each architecture group, then ensemble distillation into every group."""

    can_be_eavesdropped = True
    upload_type = Weights
    # what a FedDF can have; an instance keeps the one its architectures give (one group: the
    # global model; several: each client's group model as its personal model)
    has_global_model = True
    has_personal_models = True

    check_config = staticmethod(_check_config)

    def __init__(
        self,
        ctx: BuildContext,
        weighting: str,
        default_family: str | None,
        distill_steps: int,
        distill_batch_size: int,
        distill_lr: float,
        distill_lr_schedule: str,
        temperature: float,
        distill_clip_norm: float | None,
        early_stop_every: int,
        early_stop_patience: int | None,
        val_fraction: float,
    ):
        ctx = with_family(ctx, default_family)
        super().__init__(ctx)
        self.options = DistillOptions(
            distill_steps,
            distill_batch_size,
            distill_lr,
            distill_lr_schedule,
            temperature,
            distill_clip_norm,
            early_stop_every,
            early_stop_patience,
            val_fraction,
        )
        self.num_archs = family_size(ctx.model_factory)
        factories = (
            [partial(ctx.model_factory, arch=a) for a in range(self.num_archs)]
            if self.num_archs
            else [ctx.model_factory]
        )
        # FedAvg's server step within each group: the plain (weighted) mean of its uploads
        self.groups = [
            FedAvg(replace(ctx, model_factory=f), weighting, 1.0, 0.0, **CONSTANT_SERVER_LR)
            for f in factories
        ]
        self.students = [f().to(self.device) for f in factories]
        self.teacher_models = [f().to(self.device) for f in factories]
        self.has_global_model = len(self.groups) == 1
        self.has_personal_models = len(self.groups) > 1
        if len(self.groups) > 1 and any(g.stat_buffers(g.eval_model) for g in self.groups):
            raise ConfigError(
                "model: FedDF with several architectures keeps no running statistics "
                "(BatchNorm); use a model family without them"
            )
        pool = pool_size(ctx.data)
        self.val_size = self.options.val_size(pool)
        check_pool(pool, self.val_size + 1, "FedDF distils on the pool and validates on a part")
        order = torch.randperm(
            pool, generator=torch.Generator().manual_seed(derive_seed(ctx.seed, SPLIT_STREAM))
        )
        server_x = ctx.data.server_x
        self.val_x = server_x[order[: self.val_size].to(server_x.device)]
        self.distil_x = server_x[order[self.val_size :].to(server_x.device)]

    def arch_of(self, client_id: int) -> int:
        return client_arch(self.ctx.seed, client_id, self.num_archs) if self.num_archs else 0

    # ---- the groups' states --------------------------------------------------------------------
    def group_state(self, state: ServerState, arch: int) -> ServerState:
        """Group `arch`'s FedAvg state in the server state (one group: the state itself)."""
        if len(self.groups) == 1:
            return state
        return ServerState(state.buffers["groups"][arch], {})

    def joined(self, states: Sequence[ServerState]) -> ServerState:
        if len(states) == 1:
            return states[0]
        return ServerState(None, {"groups": [s.params for s in states]})

    def init_state(self) -> ServerState:
        return self.joined([g.init_state() for g in self.groups])

    def state_is_finite(self, state: ServerState) -> bool:
        return all(g.state_is_finite(self.group_state(state, a)) for a, g in enumerate(self.groups))

    # ---- server --------------------------------------------------------------------------------
    def broadcast_stats(self, state: ServerState) -> torch.Tensor | None:
        return self.groups[0].broadcast_stats(state) if len(self.groups) == 1 else None

    def configure_round(self, state: ServerState, ctx: RoundContext) -> Mapping[int, Message]:
        payloads = [
            GroupWeights(self.group_state(state, a).params, a) for a in range(len(self.groups))
        ]
        return {cid: payloads[self.arch_of(cid)] for cid in ctx.client_ids}

    def aggregate(
        self, state: ServerState, results: Sequence[ClientResult], ctx: RoundContext
    ) -> tuple[ServerState, dict[str, float]]:
        """FedAvg within each group (a group without clients keeps its model), then every group
        distilled from the ensemble of the round's received models."""
        states = [self.group_state(state, a) for a in range(len(self.groups))]
        by_arch: dict[int, list[int]] = {}
        for cid in results.client_ids:
            by_arch.setdefault(self.arch_of(cid), []).append(cid)
        teachers = []  # (arch, weights, running statistics) of every received model
        for arch, ids in sorted(by_arch.items()):
            part = results.take(ids)
            deltas = part.uploads().vector
            for i in range(len(ids)):
                teachers.append((arch, states[arch].params + deltas[i], part.stats(i)))
            states[arch], _ = self.groups[arch].aggregate(states[arch], part, ctx)
        if self.options.distill_steps == 0:
            return self.joined(states), {}
        targets = self.ensemble_logits(teachers)
        metrics: dict[str, float] = {}
        for arch in range(len(self.groups)):
            states[arch], fused = self.fuse(arch, states[arch], targets, ctx.round)
            metrics.update({f"feddf/arch{arch}_{k}": v for k, v in fused.items()})
        for key in ("steps", "kept_step", "val_loss"):
            values = [v for k, v in metrics.items() if k.endswith(f"_{key}")]
            if values:  # the groups' mean
                metrics[f"feddf/{key}"] = float(np.mean(values))
        return self.joined(states), metrics

    @torch.no_grad()
    def ensemble_logits(self, teachers) -> torch.Tensor:
        """The mean of the received models' logits (eval mode) on the validation part and the
        distillation part of the pool, in that order ([P, C])."""
        x = torch.cat([self.val_x, self.distil_x])
        size = self.options.distill_batch_size
        total = None
        for arch, weights, stats in teachers:
            model = self.teacher_models[arch]
            load_flat(self.groups[arch].shared(model), weights)
            self.groups[arch].load_stats(model, stats)
            logits = logits_of(model, x, size)
            total = logits if total is None else total + logits
        return total / len(teachers)

    def fuse(self, arch: int, state: ServerState, targets: torch.Tensor, round_idx: int):
        """Group `arch`'s averaged model distilled towards the ensemble: (its new state, what
        the distillation did)."""
        group, student = self.groups[arch], self.students[arch]
        load_flat(group.shared(student), state.params)
        group.load_stats(student, state.buffers.get("stats"))
        generator = torch.Generator().manual_seed(
            derive_seed(self.ctx.seed, DISTIL_STREAM, round_idx, arch)
        )
        val, train = targets[: self.val_size], targets[self.val_size :]
        done = distil(student, (self.distil_x, train), (self.val_x, val), self.options, generator)
        buffers = dict(state.buffers)
        stats = flat_stats(group.stat_buffers(student))
        if stats is not None:  # the fused model's running statistics
            buffers["stats"] = stats.to(self.device)
        fused = ServerState(flat_params(group.shared(student)), buffers)
        facts = {"steps": float(done.steps), "kept_step": float(done.kept_step)}
        if done.val_loss is not None:
            facts["val_loss"] = done.val_loss
        return fused, facts

    # ---- client: each group's FedAvg -----------------------------------------------------------
    def client_module(self, client_id: int) -> ClientModule:
        return self.groups[self.arch_of(client_id)].module

    def group_of(self, module: ClientModule) -> FedAvg:
        return next(g for g in self.groups if g.module is module)

    def begin(self, module: ClientModule, client_ids, payloads, stats) -> CohortStart:
        return self.group_of(module).begin(module, client_ids, payloads, stats)

    def end(
        self,
        module: ClientModule,
        payloads: Sequence[Message],
        params: Mapping[str, torch.Tensor],
        training: CohortTraining,
    ) -> Message:
        return self.group_of(module).end(module, payloads, params, training)

    def client_stats(self, module: ClientModule, params) -> torch.Tensor | None:
        return self.group_of(module).client_stats(module, params)

    def load_stats(self, model: nn.Module, stats: torch.Tensor | None) -> None:
        self.groups[0].load_stats(model, stats)  # one group only: several keep none

    # ---- evaluation ----------------------------------------------------------------------------
    def global_model(self, state: ServerState) -> nn.Module | None:
        return self.groups[0].global_model(state) if len(self.groups) == 1 else None

    def personal_model(self, state: ServerState, client_id: int) -> nn.Module | None:
        """The client's group model (several groups)."""
        if len(self.groups) == 1:
            return None
        arch = self.arch_of(client_id)
        return self.groups[arch].global_model(self.group_state(state, arch))

    def eavesdropped_model(self, payload: Message, upload: Message) -> nn.Module | None:
        return self.groups[payload.arch].eavesdropped_model(payload, upload)

    def describe(self) -> dict[str, float]:
        out = {} if self.num_archs else dict(self.groups[0].describe())
        if self.num_archs:
            counts = np.bincount(
                [self.arch_of(c) for c in range(self.ctx.data.num_clients)],
                minlength=self.num_archs,
            )
            for a, group in enumerate(self.groups):
                out[f"params/arch{a}_clients"] = int(counts[a])
                out[f"params/arch{a}_total"] = sum(p.numel() for p in group.eval_model.parameters())
        out["feddf/pool_distil"] = len(self.distil_x)
        out["feddf/pool_val"] = self.val_size
        return out

    def round_lrs(self, round_idx: int) -> dict[str, float]:
        return self.groups[0].round_lrs(round_idx)

    def run_warnings(self, rounds: int) -> list[str]:
        if self.options.distill_steps == 0:
            return ["algorithm.distill_steps=0: no distillation, so FedDF is FedAvg per group"]
        return []
