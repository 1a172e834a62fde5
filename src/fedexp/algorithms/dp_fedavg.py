"""DP-FedAvg (McMahan, Ramage, Talwar and Zhang, ICLR 2018, "Learning Differentially Private
Recurrent Language Models"): FedAvg with client-level differential privacy.

Each sampled client k uploads its update Delta_k = w_k - w (FedAvg's client half, unchanged).
The server enforces the privacy bound itself, so a corrupted upload cannot escape it:

    clip:      Delta_k <- Delta_k * min(1, S / ||Delta_k||_2)          (the paper's flat ClipFn)
    estimate:  Delta = (sum_{k in C} w_k Delta_k + N(0, (sigma S)^2 I)) / (q W)    (Alg. 1, f~_f)

with S = `clip`, sigma = `noise_multiplier`, q = clients_per_round / num_clients and
W = sum_k w_k over all N clients: the paper's fixed-denominator estimator, whose denominator
q W is the expected total weight of a cohort. `weighting`: uniform (w_k = 1, so q W is the
cohort size; TensorFlow Federated's DP-FedAvg aggregator, the authors' maintained code, is
unweighted) | samples (the paper's w_k = min(n_k / w_hat, 1), w_hat = `weight_cap`, the largest
client's n_k when null). Every w_k <= 1, so one client moves the noised sum by at most S. The
server then steps as FedAvg does: w <- w + server_lr * v, v <- server_momentum * v + Delta (the
paper's server momentum). The noise comes from a stream of (seed, round) alone: a seed fixes the
run, and a resumed run draws what the uninterrupted one did. The paper's optional projection
after every local step and its per-layer clipping are not implemented (flat clipping only).

Privacy is accounted by Google's `dp-accounting` (Renyi DP; chosen over Opacus: its RDP
accountant composes both subsampling events below, and it does not pin torch). Each round is
one subsampled Gaussian mechanism, composed over the rounds so far; `privacy/epsilon` is the
accountant's epsilon at `delta`. `accounting`:

- without_replacement (default): fedexp samples exactly clients_per_round clients without
  replacement, so this is the event that happens; its RDP bound (Wang, Balle and Kasiviswanathan,
  2019) holds for replace-one neighbours, under which one client moves the clipped sum by up to
  2S: the accountant is given the noise multiplier sigma / 2.
- poisson: the paper's accounting (Poisson sampling with probability q, add/remove-one
  neighbours, sensitivity S). fedexp does not sample that way, so this is an approximation.

`dp/clipped_fraction` and `dp/update_norm` (the cohort's mean norm before clipping) are
diagnostics for choosing S; they are not privatized.

BatchNorm running statistics are averages of a client's data that no clipping or noise covers:
with clipping or noise, a model with them is refused before training; with neither (sigma = 0,
clip null: FedAvg exactly) they are averaged as FedAvg averages them.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence

import dp_accounting
import numpy as np
import torch
from absl import logging as absl_logging
from dp_accounting.rdp import rdp_privacy_accountant as rdp

from fedexp.aggregators.mean import weighted_mean
from fedexp.algorithms.fedavg import FedAvg
from fedexp.core.algorithm import BuildContext
from fedexp.core.seeding import derive_seed
from fedexp.core.types import ClientResult, ConfigError, RoundContext, ServerState

# dp-accounting imports absl, whose log handler keeps the sys.stderr of import time and closes it
# whenever logging is reconfigured (Hydra does, per run) unless it is the process's own stream:
# a redirected stderr (a log file, a test's capture) would be closed under its owner.
absl_logging.get_absl_handler().python_handler.stream = sys.__stderr__

DP_NOISE_STREAM = 61  # derive_seed tag of the server's Gaussian noise, one draw per round
ACCOUNTING = ("without_replacement", "poisson")
# the largest sigma accounted: at 1e6 epsilon is already 0.0 in doubles, and from ~1e10 the
# library's replace-one (without_replacement) bound fails with a math domain error
MAX_NOISE_MULTIPLIER = 1e6


def clip_rows(updates: torch.Tensor, clip: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row scaled to L2 norm <= `clip` (None: unchanged), and the rows' norms before."""
    norms = torch.linalg.vector_norm(updates, dim=1)
    if clip is None:
        return updates, norms
    scale = torch.clamp(clip / norms, max=1.0)  # a zero row: clip / 0 = inf -> 1
    return updates * scale[:, None], norms


def dp_event(q: float, num_clients: int, cohort: int, noise_multiplier: float, accounting: str):
    """One round's `dp_accounting` event and the neighbouring relation it is accounted under."""
    rel = dp_accounting.NeighboringRelation
    if accounting == "poisson":
        gaussian = dp_accounting.GaussianDpEvent(noise_multiplier)
        return dp_accounting.PoissonSampledDpEvent(q, gaussian), rel.ADD_OR_REMOVE_ONE
    gaussian = dp_accounting.GaussianDpEvent(noise_multiplier / 2)  # replace-one: sensitivity 2S
    event = dp_accounting.SampledWithoutReplacementDpEvent(num_clients, cohort, gaussian)
    return event, rel.REPLACE_ONE


class Accountant:
    """`privacy/epsilon` after t rounds. RDP adds up over rounds, so the library's one-round RDP
    curve is computed once (the costly part, ~1 s) and scaled by t, as its own `compose(event, t)`
    does; `compute_epsilon` is the library's conversion to (epsilon, delta)."""

    def __init__(self, num_clients: int, cohort: int, noise_multiplier: float, accounting: str):
        event, relation = dp_event(
            cohort / num_clients, num_clients, cohort, noise_multiplier, accounting
        )
        unit = rdp.RdpAccountant(neighboring_relation=relation)
        unit.compose(event, 1)
        self.orders = unit._orders
        self.rdp = np.asarray(unit._rdp)  # the library's one-round curve (no public getter)

    def epsilon(self, rounds: int, delta: float) -> float:
        return float(rdp.compute_epsilon(self.orders, rounds * self.rdp, delta)[0])


class DPFedAvg(FedAvg):
    """FedAvg with server-side clipping, Gaussian noise and a fixed-denominator estimate."""

    def __init__(
        self,
        ctx: BuildContext,
        clip: float | None,
        noise_multiplier: float,
        delta: float,
        accounting: str,
        weight_cap: float | None,
        **kwargs,
    ):
        if clip is not None and not clip > 0:
            raise ConfigError(f"algorithm.clip: must be > 0 or null, got {clip}")
        if not 0 <= noise_multiplier <= MAX_NOISE_MULTIPLIER:
            raise ConfigError(
                f"algorithm.noise_multiplier: must be in [0, {MAX_NOISE_MULTIPLIER:g}], got "
                f"{noise_multiplier} (beyond it epsilon is 0 to double precision and the "
                "accountant's arithmetic fails)"
            )
        if noise_multiplier > 0 and clip is None:
            raise ConfigError(
                "algorithm.noise_multiplier: noise is sigma * clip; needs a finite algorithm.clip"
            )
        if not 0 < delta < 1:
            raise ConfigError(f"algorithm.delta: must be in (0, 1), got {delta}")
        if accounting not in ACCOUNTING:
            raise ConfigError(
                f"algorithm.accounting: must be one of {', '.join(ACCOUNTING)}, got {accounting!r}"
            )
        if weight_cap is not None and not weight_cap > 0:
            raise ConfigError(f"algorithm.weight_cap: must be > 0 or null, got {weight_cap}")
        if getattr(ctx.aggregator, "func", ctx.aggregator) is not weighted_mean:
            raise ConfigError(
                "aggregator: dp_fedavg calibrates its noise to a sum of clipped updates; "
                "needs aggregator=mean"
            )
        self.clip = None if clip is None else float(clip)
        self.noise_multiplier = float(noise_multiplier)
        self.delta = float(delta)
        self.accounting = accounting
        self.weight_cap = weight_cap
        super().__init__(ctx, **kwargs)
        self.num_clients = ctx.data.num_clients
        sizes = torch.tensor([float(ctx.data.num_train(c)) for c in range(self.num_clients)])
        self.cap = float(sizes.max()) if weight_cap is None else float(weight_cap)
        self.total_weight = float(self.client_weights_of(sizes).sum())  # W, over all N clients
        self.accountants: dict[int, Accountant] = {}  # cohort size -> its accountant
        if self.stat_buffers(self.eval_model) and (self.clip is not None or self.noise_multiplier):
            # running statistics are averages of the clients' data that would travel unclipped
            # and unnoised: privacy/epsilon would not cover them
            raise ConfigError(
                "model: dp_fedavg with clipping or noise cannot share BatchNorm running "
                "statistics privately (epsilon would not cover them); use a model without "
                "BatchNorm (e.g. model=mlp or cnn)"
            )

    @classmethod
    def check_config(cls, cfg) -> None:
        """The accountant's sampling is uniform over every client (a uniform dropout of a
        uniform cohort is one too, of the returned size): not `sampling=size` nor a trace."""
        for key, plain in (("sampling", "uniform"), ("availability", None)):
            if cfg.get(key, plain) != plain:
                raise ConfigError(
                    f"{key}: dp_fedavg's accountant assumes a uniform sample of the clients; "
                    f"leave {key}={plain if plain is not None else 'null'}"
                )

    def client_weights_of(self, sizes: torch.Tensor) -> torch.Tensor:
        """w_k: 1 (uniform) or min(n_k / w_hat, 1) (samples), on the sizes' device."""
        if self.weighting == "uniform":
            return torch.ones_like(sizes)
        return torch.clamp(sizes / self.cap, max=1.0)

    def client_weights(self, results: Sequence[ClientResult]) -> torch.Tensor:
        sizes = torch.tensor([float(r.num_samples) for r in results], device=self.device)
        return self.client_weights_of(sizes)

    def noise(self, ctx: RoundContext, size: int) -> torch.Tensor:
        """The round's N(0, 1) draw: a function of (seed, round) alone, drawn on the CPU."""
        generator = torch.Generator().manual_seed(derive_seed(ctx.seed, DP_NOISE_STREAM, ctx.round))
        return torch.randn(size, generator=generator).to(self.device)

    def aggregate(
        self, state: ServerState, results: Sequence[ClientResult], ctx: RoundContext
    ) -> tuple[ServerState, dict[str, float]]:
        updates, norms = clip_rows(self.stack_uploads(results), self.clip)
        cohort = len(ctx.client_ids)
        # q W = (m / N) W, written so that uniform weighting's W = N gives m exactly
        denominator = cohort * self.total_weight / self.num_clients
        weights = self.client_weights(results).to(updates.dtype)
        step = (weights / denominator) @ updates  # FedAvg's weighted_mean when q W = sum w_k
        if self.noise_multiplier:
            std = self.noise_multiplier * self.clip / denominator
            step = step + std * self.noise(ctx, step.numel()).to(step.dtype)
        buffers = dict(state.buffers)  # the caller's state stays as it was
        if self.server_momentum:
            buf = buffers.get("momentum")
            step = step if buf is None else self.server_momentum * buf + step
            buffers["momentum"] = step
        step = step if self.server_lr == 1.0 else self.server_lr * step
        metrics = {
            "privacy/epsilon": self.epsilon(cohort, ctx.round),
            "dp/update_norm": float(norms.mean()),
            "dp/clipped_fraction": (
                0.0 if self.clip is None else float((norms > self.clip).float().mean())
            ),
        }
        # statistics only where no privacy is claimed (refused in __init__ otherwise)
        return self.with_averaged_stats(ServerState(state.params + step, buffers), results), metrics

    def epsilon(self, cohort: int, rounds: int) -> float:
        """`privacy/epsilon` after `rounds` rounds (inf without clipping or noise)."""
        if self.clip is None or self.noise_multiplier == 0:
            return math.inf
        if cohort not in self.accountants:  # a function of the config alone: resume-safe
            self.accountants[cohort] = Accountant(
                self.num_clients, cohort, self.noise_multiplier, self.accounting
            )
        return self.accountants[cohort].epsilon(rounds, self.delta)
