"""FRL's vote (Mozaffari et al., 2023): aggregate edge rankings into the next global ranking.

A ranking lists a layer's edge ids from the lowest to the highest rank. The reputation of edge e
for a client is its position in the client's ranking; the server sums reputations over clients
and sorts the edges by that sum (ties: the lower edge id ranks lower).
"""

from __future__ import annotations

import torch


def reputations(rankings: torch.Tensor) -> torch.Tensor:
    """[n, d] rankings -> [n, d] positions: out[u, rankings[u, i]] = i (the inverse permutation)."""
    positions = torch.arange(rankings.shape[1], device=rankings.device).expand_as(rankings)
    return torch.empty_like(rankings).scatter_(1, rankings, positions)


def rank_vote(
    rankings: torch.Tensor, weights: torch.Tensor, num_malicious: int = 0
) -> torch.Tensor:
    """The global ranking: argsort of the summed reputations. One client, one vote (`weights`
    and `num_malicious` are not used)."""
    sums = reputations(rankings.long()).sum(0)
    return torch.sort(sums, stable=True).indices


rank_vote.accepts = "rankings"
