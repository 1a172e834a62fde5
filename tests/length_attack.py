"""Test-only component: an honest 'attack' whose option is a share of the run's total number of
rounds (`start_fraction`), as it declares (`depends_on_rounds`): a run with it cannot extend."""

from __future__ import annotations

from fedexp.attacks import NoAttack


class AttackFromRound(NoAttack):
    def __init__(self, start_fraction: float, fraction: float = 0.0, redraw_majority=False):
        super().__init__(fraction, redraw_majority)
        self.start_fraction = start_fraction

    @staticmethod
    def depends_on_rounds(cfg) -> list[str]:
        share = cfg.attack.start_fraction
        return [f"attack.start_fraction={share} (its first round is a share of the total)"]
