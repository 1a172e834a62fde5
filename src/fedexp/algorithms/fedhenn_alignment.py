"""FedHeNN's pieces shared by both variants: options, eta(t), the RAD, messages, the client term.

The client objective is F_i(W_i) + eta(t) * d(K(Phi_i(X; W_i)), target), where X is the round's
Representation Alignment Dataset (RAD) and the target is the global model's kernel
(homogeneous) or the aggregated kernel of the previous round's clients (heterogeneous).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from fedexp.core.client import ClientModule
from fedexp.core.local import ClientConfig
from fedexp.core.seeding import derive_seed
from fedexp.core.types import FLOAT_BITS, ConfigError, Message, VectorMessage
from fedexp.metrics.cka import KERNELS, cka_distance, kernel_matrix, linear_cka, procrustes_distance

if TYPE_CHECKING:
    from fedexp.algorithms.fedhenn_measures import Measurement

RAD_STREAM = 41  # derive_seed tag of the RAD draws, apart from SAMPLING/CLIENT/INIT
SEED_BITS = 64
VARIANTS = ("homogeneous", "heterogeneous")
RAD_SOURCES = ("server", "train", "noise")
SCHEDULES = ("constant", "linear", "sqrt", "step")
UPLOADS = ("weights", "representations")
ALIGN_LAYERS = ("body", "output")  # the body's output (the paper's text) | the logits (its code)
POOL_KEY = "partition.server_pool"


def _check(ok: bool, key: str, problem: str) -> None:
    if not ok:
        raise ConfigError(f"algorithm.{key}: {problem}")


@dataclass(frozen=True)
class AlignmentOptions:
    """The alignment half of FedHeNN's config (conf/algorithm/fedhenn.yaml has the defaults)."""

    kernel: str
    rbf_sigma: float
    distance: str
    eta0: float
    eta_schedule: str
    eta_step_every: int
    eta_step_gamma: float
    rad_size: int
    rad_source: str
    kernel_weighting: str
    upload: str
    align_layer: str

    def validate(self, variant: str, data) -> None:
        _check(variant in VARIANTS, "variant", f"must be one of {VARIANTS}, got {variant!r}")
        _check(self.kernel in KERNELS, "kernel", f"must be one of {KERNELS}, got {self.kernel!r}")
        _check(self.rbf_sigma > 0, "rbf_sigma", f"must be > 0, got {self.rbf_sigma}")
        _check(
            self.distance in ("cka", "procrustes"),
            "distance",
            f"must be cka or procrustes, got {self.distance!r}",
        )
        _check(
            not (self.distance == "procrustes" and variant == "heterogeneous"),
            "distance",
            "procrustes compares two representation matrices; heterogeneous clients align to "
            "an aggregated kernel, so use distance=cka",
        )
        _check(self.eta0 >= 0, "eta0", f"must be >= 0, got {self.eta0}")
        _check(
            self.eta_schedule in SCHEDULES,
            "eta_schedule",
            f"must be one of {SCHEDULES}, got {self.eta_schedule!r}",
        )
        _check(self.eta_step_every >= 1, "eta_step_every", "must be >= 1")
        _check(self.eta_step_gamma > 0, "eta_step_gamma", "must be > 0")
        _check(self.rad_size >= 2, "rad_size", f"must be >= 2, got {self.rad_size}")
        _check(
            self.kernel_weighting in ("uniform", "samples"),
            "kernel_weighting",
            f"must be uniform or samples, got {self.kernel_weighting!r}",
        )
        _check(self.upload in UPLOADS, "upload", f"must be one of {UPLOADS}, got {self.upload!r}")
        _check(
            self.align_layer in ALIGN_LAYERS,
            "align_layer",
            f"must be one of {ALIGN_LAYERS}, got {self.align_layer!r}",
        )
        _check(
            not (self.upload == "representations" and variant == "homogeneous"),
            "upload",
            "representations applies to variant=heterogeneous; homogeneous clients upload "
            "FedAvg's weights",
        )
        self._validate_rad(data)

    def _validate_rad(self, data) -> None:
        """Where the RAD is drawn from, and that it can be drawn there."""
        _check(
            self.rad_source in RAD_SOURCES,
            "rad_source",
            f"must be one of {RAD_SOURCES}, got {self.rad_source!r}",
        )
        if self.rad_source == "server":
            check_server_pool(self.rad_size, 0 if data.server_x is None else len(data.server_x))
        elif self.rad_source == "train":
            pool = len(data.train_pool())
            _check(
                pool >= self.rad_size,
                "rad_size",
                f"rad_source=train draws rad_size={self.rad_size} of the clients' {pool} "
                "training inputs; lower rad_size",
            )
        else:
            _check(
                data.x.is_floating_point(),
                "rad_source",
                "noise needs real-valued inputs; use server (or train) for token data",
            )

    def eta(self, round_idx: int) -> float:
        """eta = eta0 * f(s) in round t = 1, 2, ..., with s = t - 1 the authors' iteration index
        (it starts at 0): f = 1, s, sqrt(s), or gamma^floor(s / every). So `linear` and `sqrt`
        (the authors' code) align from the second round on."""
        s = round_idx - 1
        factor = {
            "constant": 1.0,
            "linear": float(s),
            "sqrt": math.sqrt(s),
            "step": self.eta_step_gamma ** (s // self.eta_step_every),
        }[self.eta_schedule]
        return self.eta0 * factor

    def run_warnings(self, rounds: int, without: str) -> list[str]:
        """The run's warnings: η(t) 0 in every round (the alignment never on: the run is
        `without`, FedAvg or isolated local training), or a RAD of the clients' own inputs."""
        if any(self.eta(t) != 0 for t in range(1, rounds + 1)):
            if self.rad_source != "train":
                return []
            return [
                "FedHeNN: algorithm.rad_source=train: each round's RAD is clients' raw training "
                "inputs sent to every sampled client (the authors' shortcut; the paper shares no "
                "client data)"
            ]
        return [
            f"FedHeNN: η(t) = 0 in all {rounds} rounds (algorithm.eta0={self.eta0:g}, "
            f"eta_schedule={self.eta_schedule}): no alignment, this run is {without}"
        ]


def check_server_pool(rad_size: int, pool: int) -> None:
    """rad_source=server draws each round's RAD from the server pool: it must hold rad_size."""
    if pool == 0:
        raise ConfigError(
            f"{POOL_KEY}: 0, but algorithm.rad_source=server draws the RAD from the server's "
            f"pool; set {POOL_KEY} >= rad_size={rad_size} (or algorithm.rad_source=train|noise)"
        )
    if pool < rad_size:
        raise ConfigError(
            f"{POOL_KEY}: {pool} < algorithm.rad_size={rad_size}, the RAD drawn from it each "
            f"round; raise {POOL_KEY} or lower algorithm.rad_size"
        )


# ---- messages ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Rad(Message):
    """A RAD: L instances. On the wire the inputs themselves (server, train: 32 bits a value)
    or the 64-bit seed that regenerates them (noise)."""

    x: torch.Tensor
    bits: int

    def num_bits(self) -> int:
        return self.bits


@dataclass(frozen=True)
class AlignPayload(VectorMessage):
    """What a client receives in a round.

    weights: the global model (homogeneous). rad/target: the RAD and the alignment target on it.
    probe: the next round's RAD, whose representations the client uploads (heterogeneous with
    upload=representations).
    `target_sent` is False where the client derives the target itself (homogeneous: from the
    global weights it receives; the server computes it once per round only to save work).
    Its `vector` is `weights` (None in the heterogeneous variant, which sends no weights).
    Not on the wire (no bits): `round_idx`, known to everyone, and `measure_on`, the (RAD,
    target) that the alignment is measured on in a homogeneous round that sends no RAD (eta = 0;
    `fedhenn_measures`): the experimenter's instrument, not the protocol's.
    """

    vector_field = "weights"
    eta: float
    weights: torch.Tensor | None = None
    rad: Rad | None = None
    target: torch.Tensor | None = None
    target_sent: bool = False
    probe: Rad | None = None
    round_idx: int = 0
    measure_on: tuple[Rad, torch.Tensor] | None = None

    def num_bits(self) -> int:
        bits = 0 if self.weights is None else self.weights.numel() * FLOAT_BITS
        bits += sum(m.num_bits() for m in (self.rad, self.probe) if m is not None)
        if self.target is not None and self.target_sent:
            bits += self.target.numel() * FLOAT_BITS
        return bits


@dataclass(frozen=True)
class ClientWeights(Message):
    """A heterogeneous client's trained weights (flat) and the index of its architecture, which
    the server knows (it runs the client's network on the RAD) and which costs nothing."""

    values: torch.Tensor
    arch: int
    measured: Measurement | None = None  # the client's alignment, measured: not on the wire

    def num_bits(self) -> int:
        return self.values.numel() * FLOAT_BITS


@dataclass(frozen=True)
class AlignmentUpload(Message):
    """A client's representations of the probe RAD (L x d), or its L x L kernel when d > L."""

    values: torch.Tensor
    is_kernel: bool
    measured: Measurement | None = None  # the client's alignment, measured: not on the wire

    def num_bits(self) -> int:
        return self.values.numel() * FLOAT_BITS


def draw_rad(opts: AlignmentOptions, data, seed: int, round_idx: int) -> Rad:
    """Round `round_idx`'s RAD, a function of (seed, round) alone.

    `server` (the paper: the server generates the RAD): `rad_size` inputs drawn without
    replacement from the server pool (`partition.server_pool`) that no client holds. `train`
    (the authors' simulation shortcut): from the pooled training inputs of all clients (labels
    unused), so clients' raw inputs reach the other clients. Both send the instances
    themselves. `noise`: N(0, 1) inputs from a shared 64-bit seed.
    """
    generator = torch.Generator().manual_seed(derive_seed(seed, RAD_STREAM, round_idx))
    if opts.rad_source == "noise":
        # the clients' inputs are standardised, so N(0, 1) matches their scale
        x = torch.randn((opts.rad_size, *data.input_shape), generator=generator)
        return Rad(x.to(data.x.device), SEED_BITS)
    if opts.rad_source == "train":
        pool = data.train_pool()
        pick = torch.randperm(len(pool), generator=generator)[: opts.rad_size]
        x = data.x[pool[pick.to(pool.device)]]
    else:
        pool = data.server_x
        pick = torch.randperm(len(pool), generator=generator)[: opts.rad_size]
        x = pool[pick.to(pool.device)]
    return Rad(x, x.numel() * FLOAT_BITS)


# ---- targets and the client term -----------------------------------------------------------------
def representations(model: nn.Module, x: torch.Tensor, layer: str) -> torch.Tensor:
    """The representations aligned, an (L, d) matrix: Phi(x), the body's output (`body`, the
    penultimate layer the paper's text names), or the network's output, its logits (`output`:
    the authors' code, whose client unpacks `log_probs, layerout = net(images)` from models
    returning `(feat_vec, label)`, so that `layerout` is the last layer's output)."""
    return (model(x) if layer == "output" else model.body(x)).flatten(1)


@torch.no_grad()
def upload_of(model: nn.Module, probe: Rad, opts: AlignmentOptions) -> AlignmentUpload:
    """What a client sends: its representations of the probe, or their kernel if narrower."""
    model.eval()
    reps = representations(model, probe.x, opts.align_layer)
    if reps.shape[1] > reps.shape[0]:
        return AlignmentUpload(kernel_matrix(reps, opts.kernel, opts.rbf_sigma), True)
    return AlignmentUpload(reps, False)


def upload_kernel(upload: AlignmentUpload, opts: AlignmentOptions) -> torch.Tensor:
    if upload.is_kernel:
        return upload.values
    return kernel_matrix(upload.values, opts.kernel, opts.rbf_sigma)


def global_target(reps: torch.Tensor, opts: AlignmentOptions) -> torch.Tensor:
    """The homogeneous target: representations (linear CKA, Procrustes) or their RBF kernel."""
    if opts.distance == "cka" and opts.kernel == "rbf":
        return kernel_matrix(reps, "rbf", opts.rbf_sigma)
    return reps


def alignment_of(eta: float, rad: Rad | None, target: torch.Tensor | None) -> dict:
    """The module's alignment attributes for (eta, RAD, target): the term is on only with all
    three (eta > 0); off, they are (0.0, None, None)."""
    active = eta > 0 and rad is not None and target is not None
    return {
        "eta": eta if active else 0.0,
        "rad": rad.x if active else None,
        "target": target if active else None,
    }


def alignment_start(payloads) -> tuple[dict, dict]:
    """(shared, attrs) of a cohort's `CohortStart`: the alignment attributes every client
    shares (the round's one payload: the usual case), else each stacked [C, ...]."""
    rows = [alignment_of(p.eta, p.rad, p.target) for p in payloads]
    first = rows[0]
    if all(
        r["eta"] == first["eta"] and r["rad"] is first["rad"] and r["target"] is first["target"]
        for r in rows
    ):
        return first, {}
    if any(r["rad"] is None for r in rows):
        raise ValueError("FedHeNN: a cohort's clients train with and without the alignment term")
    device = first["rad"].device
    etas = torch.tensor([r["eta"] for r in rows], device=device)
    stacked = {k: torch.stack([r[k] for r in rows]) for k in ("rad", "target")}
    return {}, {"eta": etas, **stacked}


class AlignModule(ClientModule):
    """Task loss + eta * d(K(Phi(X)), target). With eta = 0 or no RAD it is the plain task loss."""

    per_client_state = ("eta", "rad", "target")  # given by begin (`alignment_start`)

    def __init__(
        self, model: nn.Module, client: ClientConfig, opts: AlignmentOptions, target_is_kernel
    ):
        super().__init__(model, client)
        self.opts = opts
        self.target_is_kernel = target_is_kernel
        self.eta = 0.0
        self.rad: torch.Tensor | None = None
        self.target: torch.Tensor | None = None

    def set_alignment(self, eta: float, rad: Rad | None, target: torch.Tensor | None) -> None:
        for name, value in alignment_of(eta, rad, target).items():
            setattr(self, name, value)

    def alignment_distance(
        self, rad: torch.Tensor | None = None, target: torch.Tensor | None = None
    ) -> torch.Tensor:
        """d(K(Phi(X)), target) on the module's RAD and target, or on those given."""
        rad = self.rad if rad is None else rad
        target = self.target if target is None else target
        opts = self.opts
        reps = representations(self.model, rad, opts.align_layer)
        if opts.distance == "procrustes":
            return procrustes_distance(reps, target)
        if self.target_is_kernel or opts.kernel == "rbf":
            return cka_distance(kernel_matrix(reps, opts.kernel, opts.rbf_sigma), target)
        return 1 - linear_cka(reps, target)  # feature space: O(L d^2), not O(L^2 d)

    def training_step(self, batch, batch_idx: int) -> torch.Tensor:
        loss = self.task_loss(batch, batch_idx)
        if self.rad is None:
            return loss
        return loss + self.eta * self.alignment_distance()
