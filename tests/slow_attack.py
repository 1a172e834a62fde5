"""Test-only component: an honest 'attack' that sleeps each round, so a test can kill a run
mid-way deterministically. It changes no result (every client stays honest)."""

from __future__ import annotations

import time

from fedexp.attacks import NoAttack


class SleepEachRound(NoAttack):
    def __init__(self, seconds: float = 0.2, fraction: float = 0.0, redraw_majority: bool = False):
        # attack=none's YAML carries `fraction: 0` and `redraw_majority: false`
        super().__init__(fraction, redraw_majority)
        self.seconds = seconds

    def apply(self, results, ctx, state=None):
        time.sleep(self.seconds)
        return results
