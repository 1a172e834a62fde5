"""Inner-product manipulation (Xie, Koyejo & Gupta, "Fall of Empires: Breaking Byzantine-tolerant
SGD by Inner Product Manipulation", UAI 2019, PMLR 115, 2020): every malicious client of the round
uploads u = −ε · ḡ, ḡ the mean of the benign updates the attackers know.

The paper's attacker is omniscient: it knows the correct workers' gradients of the round and
sends −ε times their mean, so that the aggregate's inner product with the true gradient turns
negative. A small ε (the paper's 0.1) keeps the malicious copies close to zero and to each other:
coordinate-wise median and Krum, which pick central or tightly clustered values, then follow
them. Against the plain mean the aggregate is (n_b − ε·n_m)/(n_b + n_m) · ḡ (uniform weights),
reversed only when ε > n_b/n_m: the paper's large-ε setting.

`knowledge`: `honest` (default, the paper's): the uploads of the round's honest clients (a round
without one: the attackers' own benign uploads); `all`: every upload of the round, the attackers'
benign ones included (the crafted attacks' omniscient setting); `malicious`: the benign uploads
of the attackers' pool (`pool`, `pool_size`: `fedexp.attacks.pool`), the partial knowledge of
`lie`/`min_max`. ḡ is the plain mean of what is known, as in the paper.
"""

from __future__ import annotations

import math

import torch

from fedexp.attacks.pool import PoolAttack
from fedexp.core.types import VECTOR, ClientResult, ConfigError, Message, RoundContext, ServerState

KNOWLEDGE = ("honest", "all", "malicious")


def ipm_update(known: torch.Tensor, epsilon: float) -> torch.Tensor:
    """−ε · the mean of the known updates [P, d] (the row every attacker uploads)."""
    return -epsilon * known.mean(0)


class IPM(PoolAttack):
    """Every attacker of the round uploads −ε · the mean of the known benign updates."""

    name = "ipm"
    targets = (VECTOR,)  # uploads carrying a flat float vector (`VectorMessage`)

    def __init__(
        self,
        fraction: float,
        redraw_majority: bool,
        epsilon: float,
        knowledge: str,
        pool: str,
        pool_size: int,
    ):
        super().__init__(fraction, redraw_majority, pool, pool_size)
        if isinstance(epsilon, bool) or not isinstance(epsilon, int | float):
            raise ConfigError(f"attack.epsilon: must be a number > 0, got {epsilon!r}")
        if not (math.isfinite(epsilon) and epsilon > 0):
            raise ConfigError(f"attack.epsilon: must be a finite number > 0, got {epsilon}")
        if knowledge not in KNOWLEDGE:
            raise ConfigError(f"attack.knowledge: must be one of {KNOWLEDGE}, got {knowledge!r}")
        self.epsilon, self.knowledge = float(epsilon), knowledge

    def known_updates(
        self,
        results: list[ClientResult],
        positions: list[int],
        ctx: RoundContext,
        state: ServerState | None,
    ) -> torch.Tensor:
        """[P, d] the benign updates the attackers know this round (the module doc)."""
        if self.knowledge == "malicious":
            known = [u.vector for u in self.known_uploads(results, positions, ctx, state)]
        else:
            bad = set(positions)
            honest = [r for i, r in enumerate(results) if i not in bad]
            chosen = honest if self.knowledge == "honest" and honest else results
            known = [r.upload.vector for r in chosen]
        self.last_known = len(known)
        return torch.stack(known)

    def corrupt(
        self,
        results: list[ClientResult],
        positions: list[int],
        ctx: RoundContext,
        state: ServerState | None,
    ) -> list[Message]:
        crafted = ipm_update(self.known_updates(results, positions, ctx, state), self.epsilon)
        return [results[i].upload.with_vector(crafted) for i in positions]

    def describe(self) -> dict:
        return {**super().describe(), "attack/epsilon": self.epsilon}
