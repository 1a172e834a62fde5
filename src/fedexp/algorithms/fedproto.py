"""FedProto (Tan, Long, Liu, Zhou, Lu, Jiang, Zhang, AAAI 2022): federated prototype learning
across heterogeneous clients.

Each client owns its model (its own architecture where `model` is a family, e.g.
model=cnn_family model.min_fc_layers=2), kept in the client store; only prototypes travel.
A model is `head(body(x))` and the representation is f(x) = body(x).

- Client prototypes (Eq. 4): C_k^j = mean of f(x) over client k's training samples of class j,
  computed after local training with the trained model (eval mode), uploaded with the counts
  n_k^j.
- Global prototypes (Eq. 5): C_bar^j = sum_k n_k^j C_k^j / sum_k n_k^j over the round's
  clients holding class j (`proto_weighting: samples`; `uniform`: the plain mean over those
  clients, the reference code's). A class no client of the round holds keeps its last global
  prototype.
- Local loss (Eq. 8): CE(head(f(x)), y) + ld * d(f(x), C_bar^y), only for samples whose class has a
  global prototype. `distance: mse` is the reference code's nn.MSELoss (mean over the batch and
  the representation's dimensions); `sq_l2` is ||f(x) - C_bar^y||^2 averaged over the batch.

Evaluation is personal (each client's own model). Round 1 has no global prototypes: local
training only. With ld = 0 nothing received matters: isolated local training.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from fedexp.core.algorithm import Algorithm, BuildContext
from fedexp.core.client import ClientModule
from fedexp.core.cohort import CohortStart, CohortTraining, flat_rows, resident
from fedexp.core.flat import flat_params, load_flat, named_views
from fedexp.core.local import ClientConfig
from fedexp.core.seeding import INIT, client_arch, derive_seed
from fedexp.core.types import ClientResult, ConfigError, Message, RoundContext, ServerState
from fedexp.core.user_module import check_head_body
from fedexp.metrics.comm import FLOAT_BITS
from fedexp.models.family import family_size


@dataclass(frozen=True)
class Prototypes(Message):
    """Per-class prototypes [C, d]; `counts` [C] (an upload's n_k^j; a payload's 1/0 mask).
    Only the rows of classes with a nonzero count travel, each with its count."""

    protos: torch.Tensor
    counts: torch.Tensor

    def num_bits(self) -> int:
        present = int((self.counts > 0).sum())
        return present * (self.protos.shape[1] + 1) * FLOAT_BITS

    def cohort_bits(self, size: int) -> int:
        present = int((self.counts > 0).sum())  # over every client's rows
        return present * (self.protos.shape[-1] + 1) * FLOAT_BITS


class ProtoModule(ClientModule):
    """CE of the model plus ld times the distance of f(x) to its class's global prototype."""

    per_client_state = ("protos", "proto_mask")  # given by begin

    uses_task_loss = False  # the objective needs the body's output

    def __init__(self, model: nn.Module, client: ClientConfig, ld: float, distance: str):
        super().__init__(model, client)
        self.ld = ld
        self.distance = distance
        self.protos = torch.zeros(0)
        self.proto_mask = torch.zeros(0)

    def training_step(self, batch, batch_idx: int) -> torch.Tensor:
        x, y = batch
        rep = self.model.body(x)
        loss = F.cross_entropy(self.model.head(rep), y)
        # padded rows of a vectorized batch carry label -100 (cross-entropy's ignore_index)
        valid = (y >= 0).to(rep.dtype)
        yc = y.clamp(min=0)
        weight = self.proto_mask[yc] * valid  # no prototype for the class: no term
        sq = ((rep - self.protos[yc]) * weight[:, None]).pow(2).sum(1)
        count = valid.sum().clamp(min=1)
        term = sq.sum() / (count * rep.shape[1] if self.distance == "mse" else count)
        return loss + self.ld * term


@torch.no_grad()
def class_prototypes(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    num_classes: int,
    batch_size: int,
    state: Mapping[str, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(class means [C, d] of body(x) in eval mode, zero where a class is absent; counts [C]).
    `state`: the model's parameters and buffers to use (by name in `model`; `functional_call`),
    its own where None."""
    body = model.body
    if state is not None:
        own = {n[len("body.") :]: t for n, t in state.items() if n.startswith("body.")}
        body = partial(functional_call, model.body, own)
    was_training = model.training
    model.eval()
    reps = torch.cat([body(x[i : i + batch_size]) for i in range(0, len(y), batch_size)])
    model.train(was_training)
    counts = torch.bincount(y, minlength=num_classes).to(reps.dtype)
    sums = torch.zeros(num_classes, reps.shape[1], dtype=reps.dtype, device=reps.device)
    sums.index_add_(0, y, reps)
    return sums / counts.clamp(min=1)[:, None], counts


class FedProto(Algorithm):
    """Personal models (one architecture or a family); the server averages class prototypes."""

    has_personal_models = True

    upload_type = Prototypes

    def __init__(self, ctx: BuildContext, ld: float, distance: str, proto_weighting: str):
        super().__init__(ctx)
        if isinstance(ld, bool) or not isinstance(ld, (int, float)) or ld < 0:
            raise ConfigError(f"algorithm.ld: must be a number >= 0, got {ld!r}")
        if distance not in ("mse", "sq_l2"):
            raise ConfigError(f"algorithm.distance: must be mse or sq_l2, got {distance!r}")
        if proto_weighting not in ("samples", "uniform"):
            raise ConfigError(
                f"algorithm.proto_weighting: must be samples or uniform, got {proto_weighting!r}"
            )
        self.weighting = proto_weighting
        self.num_archs = family_size(ctx.model_factory)
        n = self.num_archs or 1
        self.modules = []
        for a in range(n):
            model = self.build(a).to(self.device)
            check_head_body(model, "FedProto")
            self.modules.append(ProtoModule(model, ctx.client, float(ld), distance))
        self.archs = [
            client_arch(ctx.seed, cid, n) if self.num_archs else 0
            for cid in range(ctx.data.num_clients)
        ]
        self.width = self._representation_width()

    def build(self, arch: int) -> nn.Module:
        return self.ctx.model_factory(arch=arch) if self.num_archs else self.ctx.model_factory()

    def _representation_width(self) -> int:
        x, _ = self.ctx.data.train(0)
        widths = {}
        for a, module in enumerate(self.modules):
            module.model.eval()
            with torch.no_grad():
                widths[a] = int(module.model.body(x[:2]).reshape(min(2, len(x)), -1).shape[1])
            module.model.train()
        if len(set(widths.values())) > 1:
            raise ConfigError(
                "model: FedProto averages representations across architectures, which must "
                f"share one width; got {widths} (arch: width); with model=cnn_family set "
                "model.min_fc_layers=2"
            )
        return widths[0]

    # ---- client models -------------------------------------------------------------------------
    def initial_params(self, client_id: int) -> torch.Tensor:
        """The client's initial model, rebuilt from (seed, client id) when asked for."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(derive_seed(self.ctx.seed, INIT, client_id))
            model = self.build(self.archs[client_id])
        return flat_params(list(model.parameters())).to(self.device)

    def client_params(self, client_id: int) -> torch.Tensor:
        stored = self.store.get(client_id)
        return stored if stored is not None else self.initial_params(client_id)

    # ---- server --------------------------------------------------------------------------------
    def init_state(self) -> ServerState:
        c = self.ctx.data.num_classes
        protos = torch.zeros(c, self.width, device=self.device)
        return ServerState(None, {"protos": protos, "mask": torch.zeros(c, device=self.device)})

    def configure_round(self, state: ServerState, ctx: RoundContext) -> Mapping[int, Message]:
        payload = Prototypes(state.buffers["protos"], state.buffers["mask"])
        return {cid: payload for cid in ctx.client_ids}

    def aggregate(
        self, state: ServerState, results: Sequence[ClientResult], ctx: RoundContext
    ) -> tuple[ServerState, dict[str, float]]:
        protos = torch.stack([r.upload.protos for r in results])  # [K, C, d]
        counts = torch.stack([r.upload.counts for r in results])  # [K, C]
        weights = counts if self.weighting == "samples" else (counts > 0).to(counts.dtype)
        total = weights.sum(0)
        held = total > 0
        mean = (weights[:, :, None] * protos).sum(0) / total.clamp(min=1)[:, None]
        new_protos = torch.where(held[:, None], mean, state.buffers["protos"])
        mask = torch.maximum(state.buffers["mask"], held.to(total.dtype))
        metrics = {"fedproto/classes_with_prototype": float(mask.sum())}
        return ServerState(None, {"protos": new_protos, "mask": mask}), metrics

    # ---- client --------------------------------------------------------------------------------
    def client_module(self, client_id: int) -> ClientModule:
        return self.modules[self.archs[client_id]]

    def begin(self, module: ProtoModule, client_ids, payloads, stats) -> CohortStart:
        """Each client's own parameters (stored, or its initial ones) stacked; the module's
        buffers; the received prototypes and mask, once for every client where all of them got
        the same."""
        rows = torch.stack([self.client_params(c) for c in client_ids])
        own = named_views(rows, module.model, module.model_params())
        start = CohortStart(resident(module, len(rows), {f"model.{n}": t for n, t in own.items()}))
        first = payloads[0]
        if all(p is first for p in payloads):
            start.shared.update(protos=first.protos, proto_mask=first.counts)
        else:
            start.attrs["protos"] = torch.stack([p.protos for p in payloads])
            start.attrs["proto_mask"] = torch.stack([p.counts for p in payloads])
        return start

    def end(
        self,
        module: ProtoModule,
        payloads: Sequence[Message],
        params: Mapping[str, torch.Tensor],
        training: CohortTraining,
    ) -> Message:
        """Store each client's trained parameters; upload the class prototypes of its trained
        model on the data it trained on."""
        self.store.scatter(training.client_ids, flat_rows(module, params, module.model_params()))
        c, size = self.ctx.data.num_classes, self.ctx.client.batch_size
        model = {n[len("model.") :]: t for n, t in params.items() if n.startswith("model.")}
        protos, counts = [], []
        for i, (x, y) in enumerate(training.data):
            state = {n: t[i] for n, t in model.items()}
            p, k = class_prototypes(module.model, x, y, c, size, state)
            protos.append(p)
            counts.append(k)
        return Prototypes(torch.stack(protos), torch.stack(counts))

    # ---- evaluation ----------------------------------------------------------------------------
    def personal_model(self, state: ServerState, client_id: int) -> nn.Module | None:
        model = self.modules[self.archs[client_id]].model
        load_flat(list(model.parameters()), self.client_params(client_id))
        return model

    def state_is_finite(self, state: ServerState) -> bool:
        return bool(torch.isfinite(state.buffers["protos"]).all())

    def describe(self) -> dict[str, float]:
        counts = np.bincount(self.archs, minlength=len(self.modules))
        out: dict[str, float] = {"fedproto/representation_width": self.width}
        for a, module in enumerate(self.modules):
            out[f"fedproto/arch{a}_clients"] = int(counts[a])
            out[f"fedproto/arch{a}_params"] = sum(p.numel() for p in module.model.parameters())
        return out
