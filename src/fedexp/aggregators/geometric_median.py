"""Geometric median by the smoothed Weiszfeld algorithm: RFA (Pillutla, Kakade and Harchaoui,
"Robust Aggregation for Federated Learning", IEEE Transactions on Signal Processing 2022).

The aggregate approximates argmin_z sum_i alpha_i ||z - x_i||, alpha_i the clients' weights
(sample counts under FedAvg's `weighting: samples`) normalised to sum 1. From the weighted mean
z, each iteration

    beta_i = alpha_i / max(nu, ||z - x_i||),    z <- sum_i beta_i x_i / sum_i beta_i

(nu > 0 smooths the objective where z meets an update: no division by zero), at most
`iterations` times, stopping early once the objective g(z) = sum_i alpha_i ||z - x_i|| falls by
less than `tolerance` * g(z) in an iteration (0: never early).

Defaults: the authors' reference code (krishnap25/RFA, `ServerModel.geometric_median_update`):
the weighted mean as the start, eps (nu) = 1e-5, ftol (tolerance) = 1e-6, maxiter
(iterations) = 4, the default of its `--weiszfeld-maxiter` (its main experiment scripts pass 2).
"""

from __future__ import annotations

import math

import torch

from fedexp.errors import ConfigError


def weiszfeld_objective(z: torch.Tensor, updates: torch.Tensor, alpha: torch.Tensor) -> float:
    """sum_i alpha_i ||z - x_i||."""
    return float((alpha * torch.linalg.vector_norm(updates - z, dim=1)).sum())


def geometric_median(
    updates: torch.Tensor,
    weights: torch.Tensor,
    num_malicious: int = 0,
    *,
    nu: float,
    iterations: int,
    tolerance: float,
) -> torch.Tensor:
    """The smoothed-Weiszfeld geometric median of the rows of `updates`, weighted.

    Args:
        updates: [n, d] client updates.
        weights: [n] client weights alpha_i (normalised here).
        num_malicious: not used (the rule needs no count).
        nu: the smoothing, > 0.
        iterations: at most this many Weiszfeld steps (>= 1).
        tolerance: stop once the objective falls by less than tolerance x itself (>= 0).
    """
    alpha = weights.to(updates.dtype)
    alpha = alpha / alpha.sum()
    z = alpha @ updates
    objective = weiszfeld_objective(z, updates, alpha)
    for _ in range(iterations):
        distances = torch.linalg.vector_norm(updates - z, dim=1)
        beta = alpha / distances.clamp(min=nu)
        z = (beta / beta.sum()) @ updates
        previous, objective = objective, weiszfeld_objective(z, updates, alpha)
        if abs(previous - objective) < tolerance * objective:
            break
    return z


def _check(nu: float, iterations: int, tolerance: float) -> None:
    if isinstance(nu, bool) or not isinstance(nu, int | float) or not (0 < nu < math.inf):
        raise ConfigError(f"aggregator.nu: must be a number > 0, got {nu!r}")
    if isinstance(iterations, bool) or not isinstance(iterations, int) or iterations < 1:
        raise ConfigError(f"aggregator.iterations: must be an int >= 1, got {iterations!r}")
    if (
        isinstance(tolerance, bool)
        or not isinstance(tolerance, int | float)
        or not (0 <= tolerance < math.inf)
    ):
        raise ConfigError(f"aggregator.tolerance: must be a number >= 0, got {tolerance!r}")


def _check_options(cfg) -> None:
    """The options, before any data is loaded (`check` runs again on the built partial)."""
    node = cfg.aggregator
    _check(node.get("nu"), node.get("iterations"), node.get("tolerance"))


geometric_median.check = _check
geometric_median.check_config = _check_options
