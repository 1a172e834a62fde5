"""Crafted model-poisoning attacks on weight uploads: every malicious client of the round uploads
one vector computed from the benign updates the attackers know.

- `lie` (Baruch et al., 2019): ∇_m = mean + z·std.
- `agr_tailored`, `min_max`, `min_sum` (Shejwalkar & Houmansadr, NDSS 2021): ∇_m = ∇_b − γ·p with
  ∇_b the mean of the known benign updates, p a perturbation (`unit`: ∇_b/|∇_b|, `sign`: sign(∇_b),
  `std`: their coordinate-wise std), and γ the largest value passing a success test, found by
  halving search from `gamma_init`. AGR-tailored tests against the aggregator itself (Multi-Krum:
  every malicious copy is selected; trimmed mean: the aggregate moved further from ∇_b than at
  the previous γ, as in the reference code); min-max keeps ∇_m no further from any benign update
  than the benign updates are from each other; min-sum does so for the sum of squared distances.

`knowledge`: `malicious` (default, the papers' partial knowledge): the benign updates of the
attackers' pool (`pool: all`, the reference code's: the round's sampled attackers plus other
malicious clients trained aside, `pool_size` updates in all; `pool: sampled`: the round's sampled
attackers only; see `fedexp.attacks.pool`); `all`: every update of the round (an omniscient
attacker; the pool is not used).

The success tests simulate the defence as the reference code does: over the m crafted copies
(m = the round's sampled attackers) followed by the P known benign updates, with f = β = m. P is
the pool's size, not the round's n − m honest clients: the attacker simulates the aggregator on
what it knows.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

import torch

from fedexp.aggregators import KNOWN, aggregator_name
from fedexp.aggregators.multikrum import krum_select, pairwise_sq_distances, selection_size
from fedexp.aggregators.trimmed_mean import trimmed_mean
from fedexp.attacks.pool import PoolAttack
from fedexp.core.types import VECTOR, ClientResult, ConfigError, Message, RoundContext, ServerState

PERTURBATIONS = ("unit", "sign", "std")
KNOWLEDGE = ("malicious", "all")
AGR_TARGETS = ("auto", "trimmed_mean", "multikrum")


def known_std(known: torch.Tensor) -> torch.Tensor:
    """Coordinate-wise std of the known updates (zero when only one is known)."""
    return known.std(0, correction=1) if len(known) > 1 else torch.zeros_like(known[0])


def perturbation(kind: str, benign_mean: torch.Tensor, known: torch.Tensor) -> torch.Tensor:
    if kind == "unit":
        norm = benign_mean.norm()
        return benign_mean / norm if norm > 0 else torch.zeros_like(benign_mean)
    if kind == "sign":
        return torch.sign(benign_mean)
    return known_std(known)


def halving_search(
    succeeds: Callable[[float], bool], gamma_init: float, tolerance: float = 1e-5
) -> float:
    """The NDSS'21 search: step up by half the last step on success, down on failure, halving
    the step each time; returns the last successful γ (0 if none), below 2·gamma_init."""
    gamma, step, best = gamma_init, gamma_init, 0.0
    for _ in range(200):  # the step halves each time: ~log2(gamma_init / tolerance) probes
        if abs(best - gamma) <= tolerance:
            break
        if succeeds(gamma):
            best, gamma = gamma, gamma + step / 2
        else:
            gamma = gamma - step / 2
        step /= 2
    return best


def min_max_ok(malicious: torch.Tensor, known: torch.Tensor) -> bool:
    """max_i |∇_m − ∇_i|² ≤ max_{i,j} |∇_i − ∇_j|²."""
    to_known = ((known - malicious) ** 2).sum(1)
    return bool(to_known.max() <= pairwise_sq_distances(known).max())


def min_sum_ok(malicious: torch.Tensor, known: torch.Tensor) -> bool:
    """Σ_i |∇_m − ∇_i|² ≤ min_i Σ_j |∇_i − ∇_j|²."""
    to_known = ((known - malicious) ** 2).sum()
    return bool(to_known <= pairwise_sq_distances(known).sum(1).min())


def with_copies(malicious: torch.Tensor, known: torch.Tensor, copies: int) -> torch.Tensor:
    return torch.cat([malicious.expand(copies, -1), known])


def krum_selects_all(malicious: torch.Tensor, known: torch.Tensor, copies: int) -> bool:
    """Multi-Krum (f = copies) over [copies × ∇_m; known] selects every malicious copy."""
    updates = with_copies(malicious, known, copies)
    chosen = krum_select(updates, copies, selection_size(len(updates), copies, None))
    return set(range(copies)) <= set(chosen)


def trimmed_mean_deviation(malicious: torch.Tensor, known: torch.Tensor, copies: int) -> float:
    """|TrMean(β = copies) of [copies × ∇_m; known] − mean(known)|."""
    updates = with_copies(malicious, known, copies)
    aggregate = trimmed_mean(updates, torch.ones(len(updates)), num_malicious=copies, beta=KNOWN)
    return float((aggregate - known.mean(0)).norm())


class CraftedAttack(PoolAttack):
    """Base: one crafted vector per round from the known benign updates."""

    targets = (VECTOR,)  # uploads carrying a flat float vector (`VectorMessage`)

    def __init__(
        self,
        fraction: float,
        redraw_majority: bool,
        knowledge: str,
        pool: str,
        pool_size: int,
    ):
        super().__init__(fraction, redraw_majority, pool, pool_size)
        if knowledge not in KNOWLEDGE:
            raise ConfigError(f"attack.knowledge: must be one of {KNOWLEDGE}, got {knowledge!r}")
        self.knowledge = knowledge

    def known_updates(
        self,
        results: list[ClientResult],
        positions: list[int],
        ctx: RoundContext,
        state: ServerState | None,
    ) -> torch.Tensor:
        """[P, d] the benign updates the attackers know this round (see the module doc)."""
        if self.knowledge == "all":
            self.last_known = len(results)
            return torch.stack([r.upload.vector for r in results])
        known = self.known_uploads(results, positions, ctx, state)
        return torch.stack([u.vector for u in known])

    def corrupt(
        self,
        results: list[ClientResult],
        positions: list[int],
        ctx: RoundContext,
        state: ServerState | None,
    ) -> list[Message]:
        known = self.known_updates(results, positions, ctx, state)
        crafted = self.craft(known, len(results), len(positions))
        return [results[i].upload.with_vector(crafted) for i in positions]

    def craft(self, known: torch.Tensor, round_size: int, copies: int) -> torch.Tensor:
        raise NotImplementedError


class LIE(CraftedAttack):
    """A little is enough: ∇_m = mean + z·std of the known updates."""

    name = "lie"

    def __init__(
        self,
        fraction: float,
        redraw_majority: bool,
        knowledge: str,
        pool: str,
        pool_size: int,
        z: float | None,
    ):
        super().__init__(fraction, redraw_majority, knowledge, pool, pool_size)
        self.z = z

    @staticmethod
    def z_max(round_size: int, copies: int) -> float:
        """Baruch et al.'s z: s = ⌊n/2 + 1⌋ − m, z = Φ⁻¹((n − s) / n)."""
        s = round_size // 2 + 1 - copies
        p = min(max((round_size - s) / round_size, 1e-6), 1 - 1e-6)
        return statistics.NormalDist().inv_cdf(p)

    def craft(self, known: torch.Tensor, round_size: int, copies: int) -> torch.Tensor:
        z = self.z_max(round_size, copies) if self.z is None else self.z
        return known.mean(0) + z * known_std(known)


class PerturbationAttack(CraftedAttack):
    """∇_b − γ·p with γ from the halving search against `succeeds`."""

    def __init__(
        self,
        fraction: float,
        redraw_majority: bool,
        knowledge: str,
        pool: str,
        pool_size: int,
        perturbation: str,
        gamma_init: float,
        tolerance: float,
    ):
        super().__init__(fraction, redraw_majority, knowledge, pool, pool_size)
        if perturbation not in PERTURBATIONS:
            raise ConfigError(
                f"attack.perturbation: must be one of {PERTURBATIONS}, got {perturbation!r}"
            )
        if gamma_init <= 0 or tolerance <= 0:
            raise ConfigError("attack.gamma_init/tolerance: must be > 0")
        self.perturbation, self.gamma_init, self.tolerance = perturbation, gamma_init, tolerance
        self.last_gamma = 0.0  # the round's γ, for `attack/gamma` (recomputed every round)

    def craft(self, known: torch.Tensor, round_size: int, copies: int) -> torch.Tensor:
        benign_mean = known.mean(0)
        direction = perturbation(self.perturbation, benign_mean, known)
        succeeds = self.success_test(known, copies)
        gamma = halving_search(
            lambda g: succeeds(benign_mean - g * direction), self.gamma_init, self.tolerance
        )
        self.last_gamma = gamma
        return benign_mean - gamma * direction

    def success_test(self, known: torch.Tensor, copies: int) -> Callable[[torch.Tensor], bool]:
        raise NotImplementedError

    def round_metrics(self, results) -> dict[str, float]:
        metrics = super().round_metrics(results)
        metrics["attack/gamma"] = self.last_gamma if metrics["attack/malicious_in_round"] else 0.0
        return metrics


class MinMax(PerturbationAttack):
    name = "min_max"

    def success_test(self, known, copies):
        return lambda malicious: min_max_ok(malicious, known)


class MinSum(PerturbationAttack):
    name = "min_sum"

    def success_test(self, known, copies):
        return lambda malicious: min_sum_ok(malicious, known)


class AGRTailored(PerturbationAttack):
    """Against `target`: trimmed_mean or multikrum; `auto` follows the run's aggregator and falls
    back to trimmed_mean when the run uses neither."""

    name = "agr_tailored"

    def __init__(self, fraction: float, target: str, **kwargs):
        super().__init__(fraction, **kwargs)
        if target not in AGR_TARGETS:
            raise ConfigError(f"attack.target: must be one of {AGR_TARGETS}, got {target!r}")
        self.target = target

    def setup(self, ctx, num_clients: int) -> None:
        super().setup(ctx, num_clients)
        if self.target == "auto":
            used = aggregator_name(ctx.aggregator)
            self.target = used if used in ("trimmed_mean", "multikrum") else "trimmed_mean"

    def success_test(self, known, copies):
        if self.target == "multikrum":
            return lambda malicious: krum_selects_all(malicious, known, copies)
        previous = -1.0

        def moved_further(malicious: torch.Tensor) -> bool:
            nonlocal previous
            deviation = trimmed_mean_deviation(malicious, known, copies)
            further, previous = deviation > previous, deviation
            return further

        return moved_further

    def describe(self) -> dict:
        return {**super().describe(), "attack/target": self.target}
