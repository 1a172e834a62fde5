"""FRL's attack on FRL (Mozaffari et al., 2023): vote the attackers' own consensus upside down.

The attackers train benignly, sum their reputations (each edge's position in their rankings), and
every malicious client of the round uploads the reverse of that aggregate ranking: the edges they
find most important are ranked lowest. The rankings summed are those of the attackers' pool
(`fedexp.attacks.pool`, as the crafted attacks'): with `pool: all` (FRL's reference code, which
lets up to 25 attackers train every round for this sum) the round's sampled attackers plus other
malicious clients trained aside, `pool_size` rankings in all; with `pool: sampled` the round's
sampled attackers only.
"""

from __future__ import annotations

import torch

from fedexp.aggregators.rank_vote import reputations
from fedexp.attacks.pool import PoolAttack
from fedexp.core.types import RANKING, ClientResult, Message, Ranking, RoundContext, ServerState


def reversed_consensus(rankings: torch.Tensor) -> torch.Tensor:
    """[m, d] rankings -> the aggregate ranking of their reputation sums, highest sum first."""
    sums = reputations(rankings.long()).sum(0)
    return torch.sort(sums, descending=True, stable=True).indices


class RankReversal(PoolAttack):
    name = "rank_reversal"
    targets = (RANKING,)

    def corrupt(
        self,
        results: list[ClientResult],
        positions: list[int],
        ctx: RoundContext,
        state: ServerState | None,
    ) -> list[Message]:
        known = self.known_uploads(results, positions, ctx, state)
        reversed_layers = tuple(
            reversed_consensus(torch.stack([ranking.layers[layer] for ranking in known]))
            for layer in range(len(known[0].layers))
        )
        return [Ranking(reversed_layers) for _ in positions]
