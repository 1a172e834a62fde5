"""attack.redraw_majority (FRL's reference code): a round with half or more of its sampled clients
malicious is drawn again from the same (seed, round) generator; off, the sampling is untouched."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import smoke_experiment
from fedexp.core.seeding import SAMPLING, derive_seed, sample_clients
from fedexp.core.types import ConfigError

# FedAvg at debug=smoke size (6 clients, 3 a round), half of the clients sign-flipping: seed 0
# makes clients 2, 3, 5 malicious
HALF = ("attack=sign_flip", "attack.fraction=0.5", "rounds=4", "eval_every=4")
MALICIOUS = {2, 3, 5}
# the first draw of each round under seed 0 (sample_clients as it has always drawn)
FIRST_DRAWS = [(0, 1, 2), (0, 2, 4), (2, 4, 5), (0, 2, 5)]


def draws(seed: int, round_idx: int, count: int) -> list[tuple[int, ...]]:
    """The generator's first `count` cohorts of 3 of 6 clients, drawn by hand."""
    rng = np.random.default_rng(derive_seed(seed, SAMPLING, round_idx))
    return [tuple(int(c) for c in np.sort(rng.choice(6, 3, replace=False))) for _ in range(count)]


def cohorts(tmp_path, *overrides: str) -> tuple[list[tuple[int, ...]], frozenset[int]]:
    """The cohort of every round of a smoke run, as the executor saw them."""
    exp = smoke_experiment(tmp_path, *HALF, *overrides)
    seen: list[tuple[int, ...]] = []
    run = exp.executor.run

    def recording(algorithm, payloads, ctx, data, stats=None):
        seen.append(tuple(ctx.client_ids))
        return run(algorithm, payloads, ctx, data, stats)

    exp.executor.run = recording
    exp.orchestrator().run()
    return seen, exp.attack.malicious


def test_sampling_without_rejects_is_the_first_draw_as_always():
    assert [sample_clients(0, t, 6, 3) for t in range(1, 5)] == FIRST_DRAWS
    assert [draws(0, t, 1)[0] for t in range(1, 5)] == FIRST_DRAWS
    assert sample_clients(3, 7, 50, 10) == (3, 5, 9, 12, 15, 19, 20, 22, 29, 35)


def test_a_rejected_cohort_is_the_generators_next_passing_draw():
    majority = lambda ids: 2 * len(MALICIOUS.intersection(ids)) >= len(ids)  # noqa: E731
    # round 3's first draw (2, 4, 5) holds 2 of the 3 malicious clients: drawn again
    first, second = draws(0, 3, 2)
    assert first == (2, 4, 5) and majority(first) and not majority(second)
    assert sample_clients(0, 3, 6, 3, majority) == second == (0, 3, 4)
    # round 1's (0, 1, 2) holds one: kept
    assert sample_clients(0, 1, 6, 3, majority) == (0, 1, 2)


@pytest.mark.experiment
def test_the_round_loop_redraws_majority_rounds_and_keeps_the_others(tmp_path):
    seen, malicious = cohorts(tmp_path / "on", "attack.redraw_majority=true")
    assert malicious == MALICIOUS
    # rounds 1 and 2 had one attacker of 3 and are kept; 3 and 4 had two and are drawn again
    assert seen == [(0, 1, 2), (0, 2, 4), draws(0, 3, 2)[1], draws(0, 4, 2)[1]]
    assert seen[2:] == [(0, 3, 4), (0, 4, 5)]
    assert all(len(malicious.intersection(ids)) == 1 for ids in seen)


@pytest.mark.experiment
def test_without_redraw_the_round_loop_samples_exactly_as_before(tmp_path):
    seen, _ = cohorts(tmp_path / "off", "attack.redraw_majority=false")
    assert seen == FIRST_DRAWS  # rounds 3 and 4 keep their two attackers


@pytest.mark.experiment
def test_no_passing_cohort_is_a_config_error(tmp_path):
    # 3 honest clients of 6: every cohort of 6 holds the 3 attackers, half of it
    with pytest.raises(ConfigError, match="attack.redraw_majority: 3 malicious of 6"):
        smoke_experiment(tmp_path, *HALF, "attack.redraw_majority=true", "clients_per_round=6")
    smoke_experiment(tmp_path, *HALF, "attack.redraw_majority=true", "clients_per_round=5")
    with pytest.raises(ConfigError, match="attack.redraw_majority: must be true or false"):
        smoke_experiment(tmp_path, *HALF, "attack.redraw_majority=sometimes")


def test_size_sampling_that_always_draws_a_malicious_half_is_a_config_error():
    from fedexp.attacks import NoAttack

    attack = NoAttack(0.0, True)
    attack.malicious = frozenset({0, 1})
    # 6 clients, 4 a round: clients 0 and 1 (malicious) are in every cohort (pi = 1), so every
    # cohort is at least half malicious
    with pytest.raises(ConfigError, match=r"leave no round of 4 .*\(2 malicious in every cohort"):
        attack.check_cohort(6, 4, [1.0, 1.0, 0.5, 0.5, 0.5, 0.5])
    # uniform over the same clients: a cohort of 4 may hold 4 honest clients
    attack.check_cohort(6, 4)
    # one attacker certain, the other never drawn: 1 of 4 in every cohort passes
    attack.check_cohort(6, 4, [1.0, 0.0, 0.75, 0.75, 0.75, 0.75])
    # two honest clients hold no data (pi = 0): the other four are in every cohort of 4
    with pytest.raises(ConfigError, match=r"\(2 malicious in every cohort"):
        attack.check_cohort(6, 4, [1.0, 1.0, 1.0, 1.0, 0.0, 0.0])
