"""Heterogeneous FedHeNN: each client its own architecture; clients align to an aggregated kernel.

Each client owns a model of its own architecture (a model family, e.g. model=cnn_family), drawn
at creation from (seed, client id) and kept in the client store; no weights are averaged. The
round-t clients align to K_bar(t-1) = sum_j w_j K_j / sum_j w_j over the round-(t-1) clients'
kernels K_j = K(Phi_j(X(t))) of the round-t RAD X(t). Round 1 has no K_bar yet and trains
without the term. With eta0 = 0 nothing is exchanged: isolated local training.

What travels (`algorithm.upload`):
- `weights` (the paper, and the authors' code): "the clients share the local weights with the
  server. Instead of aggregating the weights, the server uses each client's weights to generate
  representations for the RAD and aggregates the representations". The server runs each
  uploaded model on X(t+1), which it draws itself, and keeps K_bar(t) for round t+1.
- `representations` (a privacy-preserving deviation: no weights leave a client): the server
  sends X(t+1) as a probe and each client uploads Phi_i(X(t+1)), or its kernel when wider than
  the RAD. The server computes the same K_bar from them, so both options train the same models.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np
import torch
from torch import nn

from fedexp.algorithms.fedhenn_alignment import (
    AlignmentOptions,
    AlignmentUpload,
    AlignModule,
    AlignPayload,
    ClientWeights,
    Rad,
    alignment_start,
    draw_rad,
    upload_kernel,
    upload_of,
)
from fedexp.algorithms.fedhenn_measures import AlignmentMeter, kept, measured_metrics
from fedexp.core.algorithm import Algorithm, BuildContext
from fedexp.core.client import ClientModule
from fedexp.core.client_loop import load_row
from fedexp.core.cohort import CohortStart, CohortTraining, flat_rows, stack_messages
from fedexp.core.flat import flat_params, load_flat, named_views
from fedexp.core.seeding import INIT, client_arch, derive_seed
from fedexp.core.types import ClientResult, Message, Nothing, RoundContext, ServerState


class FedHeNNHeterogeneous(Algorithm):
    """Personal models of different architectures; weights (or representations) travel up,
    the RAD and the aggregated kernel down."""

    has_personal_models = True
    can_be_eavesdropped = True

    def __init__(self, ctx: BuildContext, opts: AlignmentOptions, num_archs: int):
        super().__init__(ctx)
        self.opts = opts
        self.num_archs = num_archs
        # one resident module per architecture; a client's flat weights are loaded in and out
        self.modules = [
            AlignModule(ctx.model_factory(arch=a).to(self.device), ctx.client, opts, True)
            for a in range(num_archs)
        ]
        self.archs = [client_arch(ctx.seed, cid, num_archs) for cid in range(ctx.data.num_clients)]
        # the membership-inference audit's shadows (ids outside the federation): the
        # architecture of the client each one mimics (`prepare_shadow`)
        self.shadow_archs: dict[int, int] = {}
        self.meter = AlignmentMeter(ctx.seed, self.device)

    # ---- client models -------------------------------------------------------------------------
    def arch_of(self, client_id: int) -> int:
        if client_id < len(self.archs):
            return self.archs[client_id]
        fallback = client_arch(self.ctx.seed, client_id, self.num_archs)
        return self.shadow_archs.get(client_id, fallback)

    def initial_params(self, client_id: int) -> torch.Tensor:
        """The client's freshly initialised model, rebuilt from (seed, client id) when asked for;
        not cached, so memory stays within the client store's budget."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(derive_seed(self.ctx.seed, INIT, client_id))
            model = self.ctx.model_factory(arch=self.arch_of(client_id))
        return flat_params(list(model.parameters())).to(self.device)

    def client_params(self, client_id: int) -> torch.Tensor:
        stored = self.store.get(client_id)
        return stored if stored is not None else self.initial_params(client_id)

    def model_with(self, arch: int, params: torch.Tensor) -> nn.Module:
        """The resident model of architecture `arch` holding `params` (reused by the next call)."""
        model = self.modules[arch].model
        load_flat(list(model.parameters()), params)
        return model

    # ---- server --------------------------------------------------------------------------------
    def init_state(self) -> ServerState:
        return ServerState(params=None, buffers={})

    def configure_round(self, state: ServerState, ctx: RoundContext) -> Mapping[int, Message]:
        opts, data, seed = self.opts, self.ctx.data, self.ctx.seed
        if opts.eta0 == 0:  # isolated local training: nothing to exchange
            payload = AlignPayload(0.0)
        else:
            eta = opts.eta(ctx.round)
            target = state.buffers.get("kernel")
            if state.buffers.get("kernel_round") != ctx.round or eta == 0:
                target = None  # only a K_bar computed on this round's RAD is usable
            rad = draw_rad(opts, data, seed, ctx.round) if target is not None else None
            probe = self.probe(ctx.round) if opts.upload == "representations" else None
            payload = AlignPayload(
                eta, rad=rad, target=target, target_sent=True, probe=probe, round_idx=ctx.round
            )
        return {cid: payload for cid in ctx.client_ids}

    def probe(self, round_idx: int) -> Rad:
        """X(t+1): the RAD the round-t kernels are computed on, for use in round t+1."""
        return draw_rad(self.opts, self.ctx.data, self.ctx.seed, round_idx + 1)

    @torch.no_grad()
    def client_kernel(self, upload: Message, probe: Rad | None) -> torch.Tensor:
        """K_j on X(t+1): from the client's weights (run here, by the server) or its upload."""
        if isinstance(upload, ClientWeights):
            # the very computation a client does for upload=representations, on the same weights
            upload = upload_of(self.model_with(upload.arch, upload.values), probe, self.opts)
        return upload_kernel(upload, self.opts)

    def aggregate(
        self, state: ServerState, results: Sequence[ClientResult], ctx: RoundContext
    ) -> tuple[ServerState, dict[str, float]]:
        eta = self.opts.eta(ctx.round) if self.opts.eta0 > 0 else 0.0
        metrics = {"fedhenn/eta": eta, **measured_metrics(results, eta)}
        uploads = [r for r in results if isinstance(r.upload, (AlignmentUpload, ClientWeights))]
        if not uploads:
            return state, metrics
        probe = self.probe(ctx.round) if self.opts.upload == "weights" else None
        by_samples = self.opts.kernel_weighting == "samples"
        weights = [float(r.num_samples) if by_samples else 1.0 for r in uploads]
        kernel_bar = sum(w * self.client_kernel(r.upload, probe) for w, r in zip(weights, uploads))
        buffers = dict(state.buffers)
        buffers["kernel"] = kernel_bar / sum(weights)
        buffers["kernel_round"] = ctx.round + 1  # computed on the probe = next round's RAD
        return ServerState(state.params, buffers), metrics

    # ---- client --------------------------------------------------------------------------------
    def client_module(self, client_id: int) -> ClientModule:
        return self.modules[self.arch_of(client_id)]

    def begin(self, module: AlignModule, client_ids, payloads, stats) -> CohortStart:
        """Each client's own weights (stored, or its initial model), stacked; the module's
        buffers (no weights of theirs are kept) and the round's alignment."""
        model = module.model
        own = torch.stack([self.client_params(c) for c in client_ids])
        params = named_views(own, module, list(model.parameters()))
        for name, b in module.named_buffers():
            params[name] = b.detach().expand(len(client_ids), *b.shape)
        shared, attrs = alignment_start(payloads)
        return CohortStart(params, attrs, shared)

    def end(
        self,
        module: AlignModule,
        payloads: Sequence[AlignPayload],
        params: Mapping[str, torch.Tensor],
        training: CohortTraining,
    ) -> Message:
        ids = training.client_ids
        weights = flat_rows(module, params, list(module.model.parameters()))  # [C, d], a copy
        if self.opts.eta0 == 0:  # with eta0 = 0 there is never a target to measure against
            self.store.scatter(ids, weights)
            return Nothing()
        # each client measured from its stored weights (read before they are replaced) and
        # at those it trained; the module is left as it was
        start = (list(module.model.parameters()), torch.stack([self.client_params(c) for c in ids]))
        measured = self.meter.end(module, payloads, params, training, start)
        self.store.scatter(ids, weights)
        if self.opts.upload == "weights":
            return ClientWeights(weights, self.arch_of(ids[0]), measured)
        uploads = []
        with kept(module):
            for i, payload in enumerate(payloads):
                load_row(module, params, i)
                uploads.append(upload_of(module.model, payload.probe, self.opts))
        return dataclasses.replace(stack_messages(uploads), measured=measured)

    # ---- evaluation and audit ------------------------------------------------------------------
    def personal_model(self, state: ServerState, client_id: int) -> nn.Module | None:
        return self.model_with(self.arch_of(client_id), self.client_params(client_id))

    def eavesdropped_model(self, payload: AlignPayload, upload: Message) -> nn.Module | None:
        """upload=weights: the client's model itself; representations: None (no model can be
        rebuilt from representations of a probe set)."""
        if not isinstance(upload, ClientWeights):
            return None
        return self.model_with(upload.arch, upload.values)

    def prepare_shadow(self, shadow_id: int, client_id: int) -> None:
        """A shadow of client `client_id` has its architecture and starts from its weights, which
        an eavesdropper saw in its last upload (a client not yet sampled: its initial model)."""
        self.shadow_archs[shadow_id] = self.archs[client_id]
        self.store.put(shadow_id, self.client_params(client_id).clone())

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

    def run_warnings(self, rounds: int) -> list[str]:
        return self.opts.run_warnings(rounds, "isolated local training")
