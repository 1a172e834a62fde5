"""Client sampling (`sampling: uniform | size`) and dropout (`dropout`) as functions of (seed,
round): uniform unchanged, size-weighted inclusion frequencies, hand-checked dropout counts."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedexp.core.seeding import (
    SAMPLING,
    derive_seed,
    dropped_clients,
    inclusion_probabilities,
    sample_clients,
)
from fedexp.engine.participation import Participation


def todays_draw(seed: int, round_idx: int, n: int, k: int) -> tuple[int, ...]:
    """The uniform draw as fedexp made it before `sampling` existed."""
    rng = np.random.default_rng(derive_seed(seed, SAMPLING, round_idx))
    return tuple(int(c) for c in np.sort(rng.choice(n, k, replace=False)))


@pytest.mark.parametrize("seed", [0, 1, 7, 12345])
def test_uniform_draws_the_same_cohorts_as_before(seed):
    for t in range(1, 31):
        for n, k in ((20, 10), (6, 3), (100, 7)):
            want = todays_draw(seed, t, n, k)
            assert sample_clients(seed, t, n, k) == want
            cohort = Participation(seed, n, k).cohort(t)
            assert cohort.sampled == cohort.returned == want


def test_uniform_redraw_takes_the_generators_next_draw_as_before():
    rng = np.random.default_rng(derive_seed(3, SAMPLING, 5))
    first = tuple(int(c) for c in np.sort(rng.choice(20, 10, replace=False)))
    second = tuple(int(c) for c in np.sort(rng.choice(20, 10, replace=False)))
    assert sample_clients(3, 5, 20, 10, rejects=lambda ids: ids == first) == second


def test_inclusion_probabilities_by_hand():
    # 2 of 4 with weights 1,1,2,4: pi = 2 w / 8 = 1/4, 1/4, 1/2, 1
    assert inclusion_probabilities(np.array([1, 1, 2, 4]), 2).tolist() == [0.25, 0.25, 0.5, 1.0]
    # 2 of 5 with weights 10,1,1,1,1: 2*10/14 > 1, so client 0 always; the other slot is
    # shared by four equal clients: 1/4 each
    assert inclusion_probabilities(np.array([10, 1, 1, 1, 1]), 2).tolist() == [
        1,
        0.25,
        0.25,
        0.25,
        0.25,
    ]
    # clients without samples: never drawn while others can fill the cohort
    assert inclusion_probabilities(np.array([0, 3, 1]), 1).tolist() == [0.0, 0.75, 0.25]


def test_size_sampling_frequencies_match_the_size_weights():
    # 12 clients of very different sizes, 4 a round: client 0's k n_0 / N is above 1 (always
    # drawn); the others' frequencies over R rounds must be k n_i / N re-proportioned. Each round
    # draws from its own (seed, round) stream, so a client's count over R rounds is
    # Binomial(R, pi_i): 5 standard deviations, sqrt(pi (1 - pi) / R), either side (a chance of
    # about 6e-7 per client of failing for a correct sampler; the draws are seeded, so the test
    # is deterministic)
    sizes = np.array([400, 90, 80, 70, 60, 50, 40, 30, 20, 10, 5, 1])
    n, k, rounds = len(sizes), 4, 4000
    pi = inclusion_probabilities(sizes, k)
    assert pi[0] == 1 and pi.sum() == pytest.approx(k)
    rest = sizes[1:]
    assert pi[1:] == pytest.approx((k - 1) * rest / rest.sum())
    counts = np.zeros(n)
    for t in range(1, rounds + 1):
        ids = sample_clients(0, t, n, k, weights=sizes)
        assert len(set(ids)) == k and list(ids) == sorted(ids)
        counts[list(ids)] += 1
    freq = counts / rounds
    tolerance = 5 * np.sqrt(pi * (1 - pi) / rounds)
    assert np.all(np.abs(freq - pi) <= tolerance + 1e-12), (freq, pi)
    # not uniform (k / n = 1/3): the larger clients above it, the smallest far below
    assert freq[1] > 0.5 and freq[-1] < 0.02


def test_size_sampling_with_equal_sizes_is_uniform_in_frequency():
    n, k, rounds = 10, 3, 3000
    counts = np.zeros(n)
    for t in range(1, rounds + 1):
        counts[list(sample_clients(1, t, n, k, weights=[50] * n))] += 1
    p = k / n
    assert np.all(np.abs(counts / rounds - p) <= 5 * math.sqrt(p * (1 - p) / rounds))


def test_ten_sampled_with_dropout_0_3_drop_three_each_round():
    plain, dropping = Participation(4, 20, 10), Participation(4, 20, 10, dropout=0.3)
    for t in range(1, 21):
        cohort = dropping.cohort(t)
        assert cohort.sampled == plain.cohort(t).sampled  # dropout never changes the sample
        assert len(cohort.sampled) == 10 and len(cohort.returned) == 7
        assert set(cohort.returned) < set(cohort.sampled)
        assert cohort.metrics() == {
            "clients/sampled": 10,
            "clients/returned": 7,
            "clients/dropped": 3,
        }
        gone = set(cohort.sampled) - set(cohort.returned)
        assert gone == set(dropped_clients(4, t, cohort.sampled, 0.3))  # its own (seed, round)
    # the dropped clients vary across rounds and seeds
    assert len({dropping.cohort(t).returned for t in range(1, 21)}) > 1
    assert dropping.cohort(1).returned != Participation(5, 20, 10, dropout=0.3).cohort(1).returned


@pytest.mark.parametrize(
    ("fraction", "sampled", "dropped"),
    [
        (0.0, 10, 0),
        (0.04, 10, 0),
        (0.05, 10, 1),
        (0.25, 10, 3),
        (0.5, 3, 2),
        (0.5, 1, 1),
        (0.9, 10, 9),
    ],
)
def test_dropped_count_is_the_fraction_rounded_halves_up(fraction, sampled, dropped):
    assert len(dropped_clients(0, 1, tuple(range(sampled)), fraction)) == dropped
