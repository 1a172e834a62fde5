"""Attacks corrupt the data or the uploads of malicious clients. `NoAttack` is the default."""

from __future__ import annotations

from collections.abc import Sequence

from fedexp.core.types import ClientResult, RoundContext


class NoAttack:
    """Every client is honest."""

    malicious: frozenset[int] = frozenset()

    def setup(self, ctx, num_clients: int) -> None:
        """Called once before training with the BuildContext (seed, aggregator, data...)."""

    def wrap_data(self, data):
        """The data clients train on (data-poisoning attacks return a poisoned view)."""
        return data

    def apply(self, results: Sequence[ClientResult], ctx: RoundContext) -> list[ClientResult]:
        return list(results)

    def describe(self) -> dict:
        return {}

    def state_dict(self) -> dict:
        """State that changes during training (saved in checkpoints); none for most attacks."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Restore what `state_dict` returned (on resume)."""
