"""The attackers' pool of benign uploads: what model-poisoning attacks know (the crafted attacks'
updates, rank reversal's rankings).

FRL's reference code (after Shejwalkar & Houmansadr, NDSS 2021) has the malicious clients train
benignly on their own data every round, up to 25 of them drawn from *all* malicious clients, and
crafts the poisoned update (against FRL: the reversed ranking) from those benign uploads.
`pool: all` does the same: the round's sampled attackers (whose benign uploads the round already
computed) plus other malicious clients drawn from the seed and the round until `pool_size`
uploads are known; the others train from the round's starting state through the run's own
executor and algorithm (the aside-trainer the round loop hands the attack, `use_aside`) on their
usual streams, so the pool's members are the same whichever executor runs, and nothing of that
extra training reaches the honest clients. `pool: sampled` knows only the round's sampled
attackers.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fedexp.attacks import AsideTrainer, Attack
from fedexp.core.seeding import derive_seed
from fedexp.core.types import ClientResult, ConfigError, Message, RoundContext, ServerState

POOL = 402  # seed stream of the pool draw (distinct from the malicious set's stream 401)
POOLS = ("sampled", "all")


def check_pool(pool: str, pool_size: int) -> None:
    if pool not in POOLS:
        raise ConfigError(f"attack.pool: must be one of {POOLS}, got {pool!r}")
    if isinstance(pool_size, bool) or not isinstance(pool_size, int) or pool_size < 1:
        raise ConfigError(f"attack.pool_size: must be an int >= 1, got {pool_size!r}")


def pool_extras(
    malicious: frozenset[int], sampled: Sequence[int], pool_size: int, ctx: RoundContext
) -> list[int]:
    """The malicious clients outside the round that join the pool (ascending ids): up to
    `pool_size - len(sampled)` of them, drawn without replacement from (seed, round)."""
    others = sorted(malicious.difference(sampled))
    take = min(pool_size - len(sampled), len(others))
    if take <= 0:
        return []
    rng = np.random.default_rng(derive_seed(ctx.seed, POOL, ctx.round))
    return sorted(int(c) for c in rng.choice(others, take, replace=False))


def pool_uploads(
    results: Sequence[ClientResult],
    positions: Sequence[int],
    malicious: frozenset[int],
    pool_size: int,
    ctx: RoundContext,
    state: ServerState | None,
    train_aside: AsideTrainer | None,
) -> list[Message]:
    """The pool's benign uploads: the sampled attackers' (in round order), then those of the
    drawn others, trained aside from the round's starting `state`."""
    sampled = [results[i].client_id for i in positions]
    known = [results[i].upload for i in positions]
    extras = pool_extras(malicious, sampled, pool_size, ctx)
    if extras:
        if train_aside is None or state is None:
            raise RuntimeError(
                "attack.pool=all trains attackers aside: it needs the round loop's aside-trainer "
                "(`use_aside`) and the round's starting state"
            )
        known += [r.upload for r in train_aside(state, ctx.round, extras)]
    return known


class PoolAttack(Attack):
    """Base of the attacks that know the benign uploads of their pool (`pool`, `pool_size`)."""

    def __init__(self, fraction: float, redraw_majority: bool, pool: str, pool_size: int):
        super().__init__(fraction, redraw_majority)
        check_pool(pool, pool_size)
        self.pool, self.pool_size = pool, pool_size
        self.last_known = 0  # how many benign uploads the round's attackers knew
        self.train_aside: AsideTrainer | None = None  # handed over by the round loop

    def use_aside(self, train_aside: AsideTrainer) -> None:
        self.train_aside = train_aside

    def known_uploads(
        self,
        results: Sequence[ClientResult],
        positions: Sequence[int],
        ctx: RoundContext,
        state: ServerState | None,
    ) -> list[Message]:
        """The pool's benign uploads this round (`pool: sampled`: the round's attackers')."""
        size = self.pool_size if self.pool == "all" else 0
        known = pool_uploads(results, positions, self.malicious, size, ctx, state, self.train_aside)
        self.last_known = len(known)
        return known

    def round_metrics(self, results) -> dict[str, float]:
        metrics = super().round_metrics(results)
        metrics["attack/known"] = self.last_known if metrics["attack/malicious_in_round"] else 0
        return metrics
