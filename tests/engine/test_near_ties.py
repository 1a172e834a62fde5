"""The near-tie rules of `near_ties` on hand numbers: what two float paths may disagree on."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedexp.core.types import SparseDelta
from near_ties import (
    RANKING,
    SIGNS,
    TOP_FRACTION,
    Tolerance,
    assert_same_accuracies,
    near_ties,
)

TOL = Tolerance(rtol=1e-4, atol=1e-5)


def test_a_top_k_admits_a_swap_of_magnitudes_within_the_tolerance():
    key = torch.tensor([0.5, -0.3, 0.3 + 1e-6, 0.01])
    own = SparseDelta(key[[0, 2]], torch.tensor([0, 2]), 4)  # |0.3 + 1e-6| ranks second
    assert TOP_FRACTION.admits(key, SparseDelta(key[[0, 1]], torch.tensor([0, 1]), 4), TOL)
    assert not TOP_FRACTION.admits(key, SparseDelta(key[[0, 3]], torch.tensor([0, 3]), 4), TOL)
    pinned = TOP_FRACTION.pin(key, SparseDelta(torch.zeros(2), torch.tensor([0, 1]), 4))
    assert pinned.indices.tolist() == [0, 1] and torch.equal(pinned.values, key[[0, 1]])
    assert not torch.equal(pinned.indices, own.indices)


def test_signs_admit_a_flip_only_within_the_tolerance_of_zero():
    key = torch.tensor([1e-6, -0.5, 0.3])  # to_signs: +1, -1, +1
    assert SIGNS.admits(key, torch.tensor([-1, -1, 1], dtype=torch.int8), TOL)
    assert not SIGNS.admits(key, torch.tensor([1, 1, 1], dtype=torch.int8), TOL)


def test_a_ranking_admits_a_swap_of_keys_within_the_tolerance():
    scores = torch.tensor([0.1, -(0.1 + 1e-7), 0.5])
    key = RANKING.key(scores, "abs")
    assert RANKING.admits(key, torch.tensor([1, 0, 2]), TOL)  # the stable sort gives 0, 1, 2
    assert not RANKING.admits(key, torch.tensor([2, 0, 1]), TOL)


def test_near_ties_count_samples_whose_two_largest_logits_tie():
    logits = torch.tensor([[1.0, 1.0 + 1e-6, -3.0], [2.0, 0.0, 1.0], [5.0, 5.0, 5.0]])
    assert near_ties(logits) == 2
    assert near_ties(torch.zeros(0, 3)) == 0


def test_accuracies_agree_exactly_but_by_near_ties():
    sizes, ties = [4, 2, 0], [0, 1, 0]
    assert_same_accuracies([0.75, 0.5, np.nan], [0.75, 1.0, np.nan], sizes, ties)
    with pytest.raises(AssertionError):  # client 0 holds no near-tie: exactly equal
        assert_same_accuracies([0.5, 0.5, np.nan], [0.75, 0.5, np.nan], sizes, ties)
    with pytest.raises(AssertionError):  # client 1: one tie, two samples apart
        assert_same_accuracies([0.75, 0.0, np.nan], [0.75, 1.0, np.nan], sizes, ties)
