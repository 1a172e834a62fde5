"""Robust aggregators and FRL's vote on hand-computed numbers."""

from __future__ import annotations

from functools import partial

import pytest
import torch

from components import with_yaml
from fedexp.aggregators.mean import weighted_mean
from fedexp.aggregators.median import median
from fedexp.aggregators.multikrum import krum_select, multikrum
from fedexp.aggregators.rank_vote import rank_vote, reputations
from fedexp.aggregators.sign_vote import sign_vote
from fedexp.aggregators.trimmed_mean import trimmed_mean
from fedexp.core.cohort import RoundResults
from fedexp.core.types import ClientResult, ConfigError, Weights, malicious_count
from fedexp.engine.aggregation import check_aggregator

trimmed_mean = with_yaml(trimmed_mean, "aggregator", "trimmed_mean")
multikrum = with_yaml(multikrum, "aggregator", "multikrum")

ONES4 = torch.ones(4)


def test_trimmed_mean_drops_beta_per_side():
    updates = torch.tensor([[1.0, -50.0], [2.0, 0.0], [3.0, 1.0], [100.0, 2.0]])
    # coordinate 0 keeps [2, 3] -> 2.5; coordinate 1 keeps [0, 1] -> 0.5
    assert torch.equal(trimmed_mean(updates, ONES4, beta=1), torch.tensor([2.5, 0.5]))
    assert torch.equal(trimmed_mean(updates, ONES4, num_malicious=1), torch.tensor([2.5, 0.5]))
    assert torch.equal(trimmed_mean(updates, ONES4, beta=0.25), torch.tensor([2.5, 0.5]))
    # known with no malicious client in the round: the plain mean
    assert torch.equal(trimmed_mean(updates, ONES4), torch.tensor([26.5, -11.75]))


def test_median_odd_and_even():
    assert torch.equal(
        median(torch.tensor([[1.0], [5.0], [3.0]]), torch.ones(3)), torch.tensor([3.0])
    )
    even = torch.tensor([[1.0], [2.0], [3.0], [100.0]])
    assert torch.equal(median(even, ONES4), torch.tensor([2.5]))


def test_sign_vote_majority_and_tie():
    updates = torch.tensor([[1.0, -2.0, 0.0], [3.0, -1.0, 0.0], [-1.0, -1.0, 5.0]])
    assert torch.equal(sign_vote(updates, torch.ones(3)), torch.tensor([1.0, -1.0, 1.0]))
    assert torch.equal(sign_vote(torch.tensor([[1.0], [-1.0]]), torch.ones(2)), torch.tensor([0.0]))


UPDATES5 = torch.tensor([[0.0], [1.0], [3.0], [5.0], [20.0]])


def test_multikrum_with_known_malicious_count():
    # f = 1: score = 2 nearest squared distances: 0 -> 1+9, 1 -> 1+4, 3 -> 4+4, 5 -> 4+16;
    # n - 2f - 2 = 1 selected: the update 1
    assert krum_select(UPDATES5, 1, 1) == [1]
    assert torch.equal(multikrum(UPDATES5, torch.ones(5), num_malicious=1), torch.tensor([1.0]))
    assert torch.equal(multikrum(UPDATES5, torch.ones(5), f=1), torch.tensor([1.0]))


def test_multikrum_repeated_selection():
    # f = 0, 3 selected. Round 1 (3 nearest): 0 -> 35, 1 -> 21, 3 -> 17, 5 -> 45: pick 3.
    # Round 2 over {0, 1, 5, 20} (2 nearest): 0 -> 26, 1 -> 17, 5 -> 41: pick 1.
    # Round 3 over {0, 5, 20} (1 nearest): 0 -> 25, 5 -> 25, a tie: the earlier, 0.
    assert krum_select(UPDATES5, 0, 3) == [2, 1, 0]
    out = multikrum(UPDATES5.double(), torch.ones(5), num_malicious=0)
    assert torch.equal(out, torch.tensor([4.0 / 3.0], dtype=torch.float64))


def test_reputations_of_the_papers_worked_example():
    # client 1's ranking [4,0,2,3,5,1]: e4 has reputation 0, e0 1, e2 2, e3 3, e5 4, e1 5
    ranking = torch.tensor([[4, 0, 2, 3, 5, 1]])
    assert reputations(ranking).tolist() == [[1, 5, 2, 3, 0, 4]]


def test_rank_vote_three_clients_by_hand():
    rankings = torch.tensor([[0, 1, 2, 3], [1, 0, 3, 2], [3, 2, 1, 0]])
    # reputations [0,1,2,3], [1,0,3,2], [3,2,1,0]: sums e0 4, e1 3, e2 6, e3 5
    assert torch.equal(rank_vote(rankings, torch.ones(3)), torch.tensor([1, 0, 3, 2]))
    # one client alone: the global ranking is its ranking
    assert torch.equal(rank_vote(rankings[1:2], torch.ones(1)), rankings[1])


def test_malicious_count_reads_the_attack_flags():
    results = [
        ClientResult(0, 5, Weights(torch.zeros(1)), 0.0, 1, malicious=True),
        ClientResult(1, 5, Weights(torch.zeros(1)), 0.0, 1),
    ]
    assert malicious_count(results) == 1 == malicious_count(RoundResults.of(results))


class _Uploads:
    def __init__(self, upload_type):
        self.upload_type = upload_type


def test_check_aggregator_pairs_rankings_with_rank_vote_only():
    from fedexp.core.types import Ranking

    check_aggregator(partial(rank_vote), _Uploads(Ranking))
    check_aggregator(partial(trimmed_mean, beta=1), _Uploads(Weights))
    with pytest.raises(ConfigError, match="needs aggregator=rank_vote, got trimmed_mean"):
        check_aggregator(partial(trimmed_mean), _Uploads(Ranking))
    with pytest.raises(ConfigError, match="rank_vote aggregates FRL rankings"):
        check_aggregator(partial(rank_vote), _Uploads(Weights))
    with pytest.raises(ConfigError, match="aggregator.beta"):
        check_aggregator(partial(trimmed_mean, beta=0.6), _Uploads(Weights))
    with pytest.raises(ConfigError, match="aggregator.f"):
        check_aggregator(partial(multikrum, f="some"), _Uploads(Weights))
    check_aggregator(partial(weighted_mean), _Uploads(None))
