"""Attacks that transform each malicious client's own benign upload."""

from __future__ import annotations

from fedexp.attacks import Attack, map_values
from fedexp.core.types import (
    SIGNS,
    SPARSE,
    VECTOR,
    ClientResult,
    ConfigError,
    Message,
    RoundContext,
    ServerState,
)


class SignFlip(Attack):
    """Upload the negated update: -sign(Δ) against SignSGD, -Δ against weight uploads."""

    name = "sign_flip"
    targets = (VECTOR, SIGNS, SPARSE)

    def corrupt(
        self,
        results: list[ClientResult],
        positions: list[int],
        ctx: RoundContext,
        state: ServerState | None,
    ) -> list[Message]:
        return [map_values(results[i].upload, lambda v: -v) for i in positions]


class Scaling(Attack):
    """Upload `factor` times the benign update: the naive attack that breaks plain averaging."""

    name = "scaling"
    targets = (VECTOR, SPARSE)

    def __init__(self, fraction: float, redraw_majority: bool, factor: float):
        super().__init__(fraction, redraw_majority)
        if factor == 0:
            raise ConfigError("attack.factor: must be non-zero")
        self.factor = factor

    def corrupt(
        self,
        results: list[ClientResult],
        positions: list[int],
        ctx: RoundContext,
        state: ServerState | None,
    ) -> list[Message]:
        return [map_values(results[i].upload, lambda v: self.factor * v) for i in positions]
