"""Centered clipping (Karimireddy, He and Jaggi, "Learning from History for Byzantine Robust
Optimization", ICML 2021).

From a starting point v (the previous aggregation's output: the server's history), `iterations`
times:

    v <- v + (1/n) sum_i (x_i - v) * min(1, tau / ||x_i - v||)

so each update moves v by at most tau. Unweighted (the paper's 1/n; a client cannot buy weight).
An update at v (||x_i - v|| = 0) adds nothing.

Defaults: the authors' reference code (epfml/byzantine-robust-optimizer,
`momentum-robustness/cifar10-all.py`: `Clipping(tau=100, n_iter=1)`, whose v is kept between
rounds and starts at zero). tau is in the units of the uploads: there the uploads were workers'
SGD momenta of ResNet-20 gradients; FedAvg's uploads are model deltas of a local round, whose
norms are often far below 100, and with every upload within tau of v one iteration is the
uploads' mean (v + (mean - v)). Set tau to the size of an honest deviation
(`aggregator.tau=...`).

`start: previous` takes v from the algorithm's previous aggregation (`previous`, kept in the
server state by the FedAvg family: `fedexp.aggregators.INPUTS`), zero before the first;
`start: zero` starts every round at zero.
"""

from __future__ import annotations

import math

import torch

from fedexp.errors import ConfigError

STARTS = ("previous", "zero")


def centered_clip(
    updates: torch.Tensor,
    weights: torch.Tensor,
    num_malicious: int = 0,
    *,
    tau: float,
    iterations: int,
    start: str,
    previous: torch.Tensor | None = None,
) -> torch.Tensor:
    """Centered clipping of the rows of `updates`.

    Args:
        updates: [n, d] client updates.
        weights: [n] client weights (not used).
        num_malicious: not used (the rule needs no count).
        tau: the clipping radius (> 0).
        iterations: clipping iterations per aggregation, l (>= 1).
        start: `previous` (the previous output, zero before the first) or `zero`.
        previous: the previous aggregation's output [d], or None.
    """
    v = previous if start == "previous" and previous is not None else None
    v = torch.zeros_like(updates[0]) if v is None else v.to(updates.dtype)
    n = updates.shape[0]
    for _ in range(iterations):
        diff = updates - v
        norms = torch.linalg.vector_norm(diff, dim=1)
        # tau / 0 = inf, clamped to 1: an update at v is not scaled (it adds zero)
        scale = (tau / norms).clamp(max=1.0)
        v = v + (scale.unsqueeze(1) * diff).sum(0) / n
    return v


def _check(tau: float, iterations: int, start: str) -> None:
    if isinstance(tau, bool) or not isinstance(tau, int | float) or not (0 < tau < math.inf):
        raise ConfigError(f"aggregator.tau: must be a number > 0, got {tau!r}")
    if isinstance(iterations, bool) or not isinstance(iterations, int) or iterations < 1:
        raise ConfigError(f"aggregator.iterations: must be an int >= 1, got {iterations!r}")
    if start not in STARTS:
        raise ConfigError(f"aggregator.start: must be previous or zero, got {start!r}")


def _check_options(cfg) -> None:
    """The options, before any data is loaded (`check` runs again on the built partial)."""
    node = cfg.aggregator
    _check(node.get("tau"), node.get("iterations"), node.get("start"))


centered_clip.inputs = ("previous",)
centered_clip.check = _check
centered_clip.check_config = _check_options
