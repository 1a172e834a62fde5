"""FRL's attack on FRL (Mozaffari et al., 2023): vote the attackers' own consensus upside down.

The round's malicious clients train benignly, sum their reputations (each edge's position in their
rankings), and every one of them uploads the reverse of that aggregate ranking: the edges they
find most important are ranked lowest. (FRL's reference code lets up to 25 attackers train every
round for this sum; here the sampled attackers do.)
"""

from __future__ import annotations

import torch

from fedexp.aggregators.rank_vote import reputations
from fedexp.attacks import Attack
from fedexp.core.messages import Ranking
from fedexp.core.types import RANKING, ClientResult, Message, RoundContext


def reversed_consensus(rankings: torch.Tensor) -> torch.Tensor:
    """[m, d] rankings -> the aggregate ranking of their reputation sums, highest sum first."""
    sums = reputations(rankings.long()).sum(0)
    return torch.sort(sums, descending=True, stable=True).indices


class RankReversal(Attack):
    name = "rank_reversal"
    targets = (RANKING,)

    def corrupt(
        self, results: list[ClientResult], positions: list[int], ctx: RoundContext
    ) -> list[Message]:
        num_layers = len(results[positions[0]].upload.layers)
        reversed_layers = tuple(
            reversed_consensus(torch.stack([results[i].upload.layers[layer] for i in positions]))
            for layer in range(num_layers)
        )
        return [Ranking(reversed_layers) for _ in positions]
