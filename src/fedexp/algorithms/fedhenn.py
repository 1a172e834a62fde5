"""FedHeNN (Makhija, Han, Ho, Ghosh, ICML 2022): clients align the CKA geometry of their
representations of a server-held Representation Alignment Dataset (RAD).

Homogeneous: one architecture; the global model is FedAvg's, and each client adds
eta(t) * d(K(Phi_i(X; W_i)), K(Phi(X; W_global(t-1)))). With eta = 0 this is FedAvg exactly.

Heterogeneous: each client owns a model of its own architecture (a model family, e.g.
model=cnn_family), drawn at creation from (seed, client id) and kept in the client store; no
weights are averaged. The round-t clients align to K_bar(t-1) = sum_j w_j K_j / sum_j w_j over the
round-(t-1) clients' kernels of the round-t RAD (which those clients received as a probe and
whose representations they uploaded). Round 1 has no K_bar yet and trains without the term.
With eta = 0 nothing is exchanged: isolated local training.

The RAD is re-drawn each round as `rad_size` inputs sampled from the pooled training inputs of all
clients (rad_source=train, the paper's choice; nothing is taken away from any client), or, as
documented deviations, from `server_pool` samples that no client holds (rad_source=holdout) or
from N(0, 1) noise (rad_source=noise).
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from dataclasses import replace

import numpy as np
import torch
from torch import nn

from fedexp.algorithms.fedavg import FedAvg
from fedexp.algorithms.fedhenn_alignment import (
    AlignmentOptions,
    AlignmentUpload,
    AlignModule,
    AlignPayload,
    draw_rad,
    global_target,
    representations,
    upload_kernel,
    upload_of,
)
from fedexp.core.algorithm import Algorithm, BuildContext, flat_params, load_flat
from fedexp.core.client import ClientModule
from fedexp.core.config import default_family as family_factory
from fedexp.core.seeding import INIT, client_arch, derive_seed
from fedexp.core.types import (
    ClientResult,
    ConfigError,
    Message,
    Nothing,
    RoundContext,
    ServerState,
    Weights,
)
from fedexp.models.family import family_size


def fedhenn(
    ctx: BuildContext,
    variant: str = "homogeneous",
    kernel: str = "linear",
    rbf_sigma: float = 1.0,
    distance: str = "cka",
    eta0: float = 0.01,
    eta_schedule: str = "sqrt",
    eta_step_every: int = 50,
    eta_step_gamma: float = 2.0,
    rad_size: int = 100,
    rad_source: str = "train",
    kernel_weighting: str = "uniform",
    default_family: str = "auto",
    server_pool: int = 0,  # consumed by fedexp.run before the partition; checked via the data
    **fedavg_kwargs,
) -> Algorithm:
    """Build the FedHeNN variant named by `variant` (the `_target_` of algorithm=fedhenn)."""
    opts = AlignmentOptions(
        kernel,
        float(rbf_sigma),
        distance,
        float(eta0),
        eta_schedule,
        int(eta_step_every),
        float(eta_step_gamma),
        int(rad_size),
        rad_source,
        kernel_weighting,
    )
    opts.validate(variant, ctx.data)
    num_archs = family_size(ctx.model_factory)
    if variant == "homogeneous":
        if num_archs is not None:
            raise ConfigError(
                "model: algorithm.variant=homogeneous needs one architecture, got a model "
                f"family of {num_archs}; use e.g. model=cnn or algorithm.variant=heterogeneous"
            )
        return FedHeNNHomogeneous(ctx, opts, **fedavg_kwargs)
    inspect.signature(FedAvg).bind_partial(ctx, **fedavg_kwargs)  # unused here; typos refused
    if num_archs is None:  # one architecture chosen: draw clients' models from the default family
        ctx = replace(ctx, model_factory=family_factory(default_family, ctx.model_args))
        num_archs = family_size(ctx.model_factory)
    return FedHeNNHeterogeneous(ctx, opts, num_archs)


class FedHeNNHomogeneous(FedAvg):
    """FedAvg's global model; clients add the alignment term to the previous global model."""

    def __init__(self, ctx: BuildContext, opts: AlignmentOptions, **fedavg_kwargs):
        self.opts = opts
        super().__init__(ctx, **fedavg_kwargs)

    def make_module(self, model: nn.Module) -> ClientModule:
        return AlignModule(model, self.ctx.client_cfg, self.opts, target_is_kernel=False)

    def configure_round(self, state: ServerState, ctx: RoundContext) -> Mapping[int, Message]:
        eta = self.opts.eta(ctx.round)
        rad = target = None
        if eta > 0:
            rad = draw_rad(self.opts, self.ctx.data, self.ctx.seed, ctx.round)
            # every client derives the same target from the weights it receives: compute it once
            model = self.global_model(state)
            with torch.no_grad():
                model.eval()
                target = global_target(representations(model, rad.x), self.opts)
        payload = AlignPayload(eta, weights=state.params, rad=rad, target=target)
        return {cid: payload for cid in ctx.client_ids}

    def client_begin(self, module: AlignModule, client_id: int, payload: AlignPayload) -> None:
        load_flat(self.shared(module.model), payload.weights)
        module.set_alignment(payload.eta, payload.rad, payload.target)

    def client_end(self, module: AlignModule, client_id: int, payload: AlignPayload) -> Message:
        # the client keeps its local model: the personal metrics evaluate it
        self.store.put(client_id, flat_params(list(module.model.parameters())))
        return Weights(flat_params(self.shared(module.model)) - payload.weights)

    def aggregate(
        self, state: ServerState, results: Sequence[ClientResult], ctx: RoundContext
    ) -> tuple[ServerState, dict[str, float]]:
        state, metrics = super().aggregate(state, results, ctx)
        return state, {**metrics, "fedhenn/eta": self.opts.eta(ctx.round)}

    def personal_model(self, state: ServerState, client_id: int) -> nn.Module | None:
        # a client never sampled has no local model yet: it would start from the global one
        model = self.module.model
        load_flat(list(model.parameters()), self.store.get(client_id, state.params))
        return model

    def eavesdropped_model(self, payload: AlignPayload, upload: Message) -> nn.Module | None:
        """The client's local model: the broadcast weights plus the uploaded delta."""
        load_flat(self.shared(self.eval_model), payload.weights + upload.values)
        return self.eval_model


class FedHeNNHeterogeneous(Algorithm):
    """Personal models of different architectures; only representations and kernels travel."""

    def __init__(self, ctx: BuildContext, opts: AlignmentOptions, num_archs: int):
        super().__init__(ctx)
        self.opts = opts
        self.num_archs = num_archs
        # one resident module per architecture; a client's flat weights are loaded in and out
        self.modules = [
            AlignModule(ctx.model_factory(arch=a).to(self.device), ctx.client_cfg, opts, True)
            for a in range(num_archs)
        ]
        self.archs = [client_arch(ctx.seed, cid, num_archs) for cid in range(ctx.data.num_clients)]

    # ---- client models -------------------------------------------------------------------------
    def initial_params(self, client_id: int) -> torch.Tensor:
        """The client's freshly initialised model, rebuilt from (seed, client id) when asked for;
        not cached, so memory stays within the client store's budget."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(derive_seed(self.ctx.seed, INIT, client_id))
            model = self.ctx.model_factory(arch=self.archs[client_id])
        return flat_params(list(model.parameters())).to(self.device)

    def client_params(self, client_id: int) -> torch.Tensor:
        stored = self.store.get(client_id)
        return stored if stored is not None else self.initial_params(client_id)

    # ---- server --------------------------------------------------------------------------------
    def init_state(self) -> ServerState:
        return ServerState(params=None, buffers={})

    def configure_round(self, state: ServerState, ctx: RoundContext) -> Mapping[int, Message]:
        opts, data, seed = self.opts, self.ctx.data, self.ctx.seed
        if opts.eta0 == 0:  # isolated local training: nothing to exchange
            payload = AlignPayload(0.0)
        else:
            target = state.buffers.get("kernel")
            if state.buffers.get("kernel_round") != ctx.round:
                target = None  # only a K_bar computed on this round's RAD is usable
            rad = draw_rad(opts, data, seed, ctx.round) if target is not None else None
            probe = draw_rad(opts, data, seed, ctx.round + 1)
            payload = AlignPayload(
                opts.eta(ctx.round), rad=rad, target=target, target_sent=True, probe=probe
            )
        return {cid: payload for cid in ctx.client_ids}

    def aggregate(
        self, state: ServerState, results: Sequence[ClientResult], ctx: RoundContext
    ) -> tuple[ServerState, dict[str, float]]:
        metrics = {"fedhenn/eta": self.opts.eta(ctx.round) if self.opts.eta0 > 0 else 0.0}
        uploads = [r for r in results if isinstance(r.upload, AlignmentUpload)]
        if not uploads:
            return state, metrics
        by_samples = self.opts.kernel_weighting == "samples"
        weights = [float(r.num_samples) if by_samples else 1.0 for r in uploads]
        kernel_bar = sum(w * upload_kernel(r.upload, self.opts) for w, r in zip(weights, uploads))
        buffers = dict(state.buffers)
        buffers["kernel"] = kernel_bar / sum(weights)
        buffers["kernel_round"] = ctx.round + 1  # computed on the probe = next round's RAD
        return ServerState(state.params, buffers), metrics

    # ---- client --------------------------------------------------------------------------------
    def client_module(self, client_id: int) -> ClientModule:
        return self.modules[self.archs[client_id]]

    def client_begin(self, module: AlignModule, client_id: int, payload: AlignPayload) -> None:
        load_flat(list(module.model.parameters()), self.client_params(client_id))
        module.set_alignment(payload.eta, payload.rad, payload.target)

    def client_end(self, module: AlignModule, client_id: int, payload: AlignPayload) -> Message:
        self.store.put(client_id, flat_params(list(module.model.parameters())))
        if payload.probe is None:
            return Nothing()
        return upload_of(module.model, payload.probe, self.opts)

    # ---- evaluation ----------------------------------------------------------------------------
    def personal_model(self, state: ServerState, client_id: int) -> nn.Module | None:
        model = self.modules[self.archs[client_id]].model
        load_flat(list(model.parameters()), self.client_params(client_id))
        return model

    def eavesdropped_model(self, payload: AlignPayload, upload: Message) -> nn.Module | None:
        """None: the uploads are representations of a probe set; no model can be rebuilt."""

    def state_is_finite(self, state: ServerState) -> bool:
        kernel = state.buffers.get("kernel")
        return kernel is None or bool(torch.isfinite(kernel).all())

    def describe(self) -> dict[str, float]:
        counts = np.bincount(self.archs, minlength=self.num_archs)
        out: dict[str, float] = {}
        for a, module in enumerate(self.modules):
            out[f"fedhenn/arch{a}_clients"] = int(counts[a])
            out[f"fedhenn/arch{a}_params"] = sum(p.numel() for p in module.model.parameters())
        return out
