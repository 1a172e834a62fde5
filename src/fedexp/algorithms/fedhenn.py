"""FedHeNN (Makhija, Han, Ho, Ghosh, ICML 2022): clients align the CKA geometry of their
representations of a server-held Representation Alignment Dataset (RAD).

Homogeneous: one architecture; the global model is FedAvg's, and each client adds
eta(t) * d(K(Phi_i(X; W_i)), K(Phi(X; W_global(t-1)))). With eta = 0 this is FedAvg exactly.

Heterogeneous (`fedhenn_heterogeneous`): each client its own architecture; clients upload their
weights and the server aggregates their kernels on the RAD (or, with upload=representations,
clients upload representations). With eta = 0 it is isolated local training.

The RAD is re-drawn each round: `rad_size` inputs from the server's pool, training samples set
aside before partitioning that no client holds (rad_source=server, the default: the paper's
server generates the RAD; `partition.server_pool`), or, as documented options, from the
clients' pooled raw training inputs (rad_source=train, the authors' simulation shortcut, which
shares clients' inputs) or from N(0, 1) noise (rad_source=noise).

`align_layer` picks what is aligned: the body's output (the paper's text) or the network's
output (the authors' code). Each round's alignment is measured (`fedhenn_measures`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace

import torch
from omegaconf import OmegaConf
from torch import nn

from fedexp.algorithms.fedavg import FedAvg, payload_rows
from fedexp.algorithms.fedhenn_alignment import (
    AlignmentOptions,
    AlignModule,
    AlignPayload,
    alignment_start,
    check_server_pool,
    draw_rad,
    global_target,
    representations,
)
from fedexp.algorithms.fedhenn_heterogeneous import FedHeNNHeterogeneous
from fedexp.algorithms.fedhenn_measures import AlignmentMeter, MeasuredWeights, measured_metrics
from fedexp.core.algorithm import Algorithm, BuildContext
from fedexp.core.client import ClientModule
from fedexp.core.cohort import CohortStart, CohortTraining
from fedexp.core.flat import load_flat
from fedexp.core.types import ClientResult, ConfigError, Message, RoundContext, ServerState
from fedexp.errors import with_checks
from fedexp.models.family import family_size
from fedexp.models.running_stats import load_model_state, state_of_rows

log = logging.getLogger(__name__)


def _check_config(cfg) -> None:
    """rad_source=server needs a server pool of at least rad_size (before any data is loaded)."""
    if cfg.algorithm.rad_source == "server":
        pool = OmegaConf.select(cfg, "partition.server_pool", default=0)
        check_server_pool(int(cfg.algorithm.rad_size), int(pool))


def _pool_need(cfg) -> int:
    """`partition.server_pool: auto`: twice the RAD with rad_source=server (each round's RAD a
    fresh draw from the pool), else none."""
    if OmegaConf.select(cfg, "algorithm.rad_source") != "server":
        return 0
    return 2 * int(OmegaConf.select(cfg, "algorithm.rad_size", default=0))


@with_checks(config=_check_config)
def fedhenn(
    ctx: BuildContext,
    variant: str,
    kernel: str,
    rbf_sigma: float,
    distance: str,
    eta0: float,
    eta_schedule: str,
    eta_step_every: int,
    eta_step_gamma: float,
    rad_size: int,
    rad_source: str,
    kernel_weighting: str,
    upload: str,
    default_family: str,
    weighting: str,
    server_lr: float,
    server_momentum: float,
    align_layer: str,
    server_lr_schedule: str,
    server_lr_decay: float,
    server_lr_step_rounds: int,
    server_lr_min: float,
    server_lr_warmup_rounds: int,
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
        upload,
        align_layer,
    )
    opts.validate(variant, ctx.data)
    if rad_source == "train" and opts.eta0 > 0:
        log.warning(
            "algorithm.rad_source=train: each round's RAD is drawn from the clients' raw "
            "training inputs and sent to every sampled client (the authors' simulation "
            "shortcut; in the paper the server generates the RAD and clients share no data)"
        )
    fedavg_args = (weighting, server_lr, server_momentum, server_lr_schedule, server_lr_decay)
    fedavg_args += (server_lr_step_rounds, server_lr_min, server_lr_warmup_rounds)
    return _variant(ctx, opts, variant, default_family, fedavg_args)


def _variant(ctx: BuildContext, opts, variant: str, default_family: str, fedavg_args) -> Algorithm:
    """The homogeneous variant (FedAvg's server step, `fedavg_args`) on one architecture, or
    the heterogeneous one on a model family (`default_family` where one architecture was
    chosen)."""
    num_archs = family_size(ctx.model_factory)
    if variant == "homogeneous":
        if num_archs is not None:
            raise ConfigError(
                "model: algorithm.variant=homogeneous needs one architecture, got a model "
                f"family of {num_archs}; use e.g. model=cnn or algorithm.variant=heterogeneous"
            )
        return FedHeNNHomogeneous(ctx, opts, *fedavg_args)
    if num_archs is None:  # one architecture chosen: draw clients' models from the default family
        if ctx.family is None:
            raise ConfigError("model: FedHeNN needs a model family; its build context has none")
        ctx = replace(ctx, model_factory=ctx.family(default_family))
        num_archs = family_size(ctx.model_factory)
    return FedHeNNHeterogeneous(ctx, opts, num_archs)


fedhenn.server_pool_need = _pool_need  # `partition.server_pool: auto` (fedexp.config.pool)


class FedHeNNHomogeneous(FedAvg):
    """FedAvg's global model; clients add the alignment term to the previous global model."""

    has_personal_models = True

    def __init__(self, ctx: BuildContext, opts: AlignmentOptions, *fedavg_args, **fedavg_kwargs):
        self.opts = opts
        super().__init__(ctx, *fedavg_args, **fedavg_kwargs)
        self.meter = AlignmentMeter(ctx.seed, self.device)

    def make_module(self, model: nn.Module) -> ClientModule:
        return AlignModule(model, self.ctx.client, self.opts, target_is_kernel=False)

    def configure_round(self, state: ServerState, ctx: RoundContext) -> Mapping[int, Message]:
        eta = self.opts.eta(ctx.round)
        rad = draw_rad(self.opts, self.ctx.data, self.ctx.seed, ctx.round)  # its own stream
        # every client derives the same target from the weights it receives: compute it once
        model = self.global_model(state)
        with torch.no_grad():
            model.eval()
            reps = representations(model, rad.x, self.opts.align_layer)
            target = global_target(reps, self.opts)
        if eta > 0:
            payload = AlignPayload(eta, state.params, rad, target, round_idx=ctx.round)
        else:  # no RAD is sent; the alignment is still measured on this one (no bits)
            payload = AlignPayload(eta, state.params, round_idx=ctx.round, measure_on=(rad, target))
        return {cid: payload for cid in ctx.client_ids}

    # FedAvg's client half reads the weights as `payload.vector`; the alignment comes on top
    def begin(self, module: AlignModule, client_ids, payloads, stats) -> CohortStart:
        start = super().begin(module, client_ids, payloads, stats)
        shared, attrs = alignment_start(payloads)
        start.shared.update(shared)
        start.attrs.update(attrs)
        return start

    def end(
        self,
        module: AlignModule,
        payloads: Sequence[AlignPayload],
        params: Mapping[str, torch.Tensor],
        training: CohortTraining,
    ) -> Message:
        # the clients keep their local models (with running statistics): the personal metrics
        # evaluate them
        self.store.scatter(training.client_ids, state_of_rows(module.model, params, "model."))
        upload = super().end(module, payloads, params, training)
        # each client measured from the weights it received and at those it trained; the
        # module is left as it was
        start = (self.shared(module.model), payload_rows(payloads))
        measured = self.meter.end(module, payloads, params, training, start)
        return MeasuredWeights(upload.values, measured)

    def aggregate(
        self, state: ServerState, results: Sequence[ClientResult], ctx: RoundContext
    ) -> tuple[ServerState, dict[str, float]]:
        state, metrics = super().aggregate(state, results, ctx)
        eta = self.opts.eta(ctx.round)
        return state, {**metrics, "fedhenn/eta": eta, **measured_metrics(results, eta)}

    def run_warnings(self, rounds: int) -> list[str]:
        return self.opts.run_warnings(rounds, "FedAvg")

    def personal_model(self, state: ServerState, client_id: int) -> nn.Module | None:
        # a client never sampled has no local model yet: it would start from the global one
        model = self.module.model
        stored = self.store.get(client_id)
        if stored is None:
            load_flat(self.shared(model), state.params)
            self.load_stats(model, state.buffers.get("stats"))
        else:
            load_model_state(model, stored)
        return model
