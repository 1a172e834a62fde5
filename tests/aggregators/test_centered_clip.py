"""Centered clipping on vectors in 2-D, by hand, and its starting point kept between rounds."""

from __future__ import annotations

import math
from functools import partial

import pytest
import torch

from components import with_yaml
from fedexp.aggregators import PREVIOUS_KEY
from fedexp.aggregators.centered_clip import centered_clip
from fedexp.algorithms.aggregation_inputs import aggregate_rows
from fedexp.algorithms.fedavg import CONSTANT_SERVER_LR, FedAvg
from fedexp.core.types import ConfigError, RoundContext, ServerState, Weights
from fedexp.engine.aggregation import check_aggregator
from handworld import make_ctx, one_round, two_client_data

centered_clip = with_yaml(centered_clip, "aggregator", "centered_clip")

X = torch.tensor([[0.0, 0.0], [3.0, 4.0], [0.0, 10.0]], dtype=torch.float64)
ONES = torch.ones(3)


def test_one_iteration_from_zero_by_hand():
    # from v = 0, tau = 1: (0,0) adds 0; (3,4) has norm 5 -> (0.6, 0.8); (0,10) -> (0, 1);
    # v = (0.6, 1.8) / 3
    out = centered_clip(X, ONES, tau=1.0, start="zero")
    assert torch.allclose(out, torch.tensor([0.2, 0.6], dtype=torch.float64), atol=1e-15)


def test_two_iterations_by_hand():
    # the second from v = (0.2, 0.6): (-0.2, -0.6) has norm sqrt(0.4) < 1, kept whole;
    # (2.8, 3.4) norm sqrt(19.4) and (-0.2, 9.4) norm sqrt(88.4), each scaled to norm 1
    v = torch.tensor([0.2, 0.6], dtype=torch.float64)
    steps = [
        torch.tensor([-0.2, -0.6]),
        torch.tensor([2.8, 3.4]) / math.sqrt(19.4),
        torch.tensor([-0.2, 9.4]) / math.sqrt(88.4),
    ]
    expected = v + sum(steps).double() / 3
    out = centered_clip(X, ONES, tau=1.0, iterations=2, start="zero")
    assert torch.allclose(out, expected, atol=1e-7)


def test_it_starts_from_the_previous_aggregate():
    # from v = (3, 4), tau = 1: (0,0) - v = (-3,-4), norm 5 -> (-0.6, -0.8); (3,4) adds 0;
    # (0,10) - v = (-3, 6), norm sqrt(45) -> (-3, 6) / sqrt(45)
    previous = torch.tensor([3.0, 4.0], dtype=torch.float64)
    step = torch.tensor([-0.6 - 3 / math.sqrt(45), -0.8 + 6 / math.sqrt(45)], dtype=torch.float64)
    expected = previous + step / 3
    out = centered_clip(X, ONES, tau=1.0, previous=previous)  # start: previous (the YAML's)
    assert torch.allclose(out, expected, atol=1e-15)
    # start=zero ignores it; no previous yet (the first round) starts at zero
    zero = centered_clip(X, ONES, tau=1.0, start="zero")
    assert torch.equal(centered_clip(X, ONES, tau=1.0, start="zero", previous=previous), zero)
    assert torch.equal(centered_clip(X, ONES, tau=1.0, previous=None), zero)


def test_a_radius_no_update_reaches_is_the_unweighted_mean():
    # every ||x_i - v|| < tau: v + mean(x - v) = mean(x), whatever v; weights are not used
    out = centered_clip(X, torch.tensor([1.0, 5.0, 1.0]), previous=torch.tensor([1.0, 1.0]))
    assert torch.allclose(out, X.mean(0), atol=1e-12)


def test_aggregate_rows_hands_the_previous_output_and_keeps_the_new_one():
    class Algo:
        ctx = type("Ctx", (), {"aggregator": partial(centered_clip, tau=1.0)})()

    ctx = RoundContext(1, (0, 1, 2), 0)
    first, kept = aggregate_rows(Algo(), X, ONES, ServerState(torch.zeros(2)), ctx)
    assert torch.allclose(first, torch.tensor([0.2, 0.6], dtype=torch.float64))  # from zero
    assert kept.keys() == {PREVIOUS_KEY} and kept[PREVIOUS_KEY] is first
    second, kept = aggregate_rows(Algo(), X, ONES, ServerState(torch.zeros(2), kept), ctx)
    assert torch.allclose(second, centered_clip(X, ONES, tau=1.0, previous=first))
    assert not torch.allclose(second, first)


class _Vectors:
    upload_type = Weights
    aggregator_inputs = ("previous", "reference")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"tau": 0.0}, "aggregator.tau: must be a number > 0, got 0.0"),
        ({"tau": -1.0}, "aggregator.tau: must be a number > 0, got -1.0"),
        ({"tau": "big"}, "aggregator.tau: must be a number > 0, got 'big'"),
        ({"iterations": 0}, "aggregator.iterations: must be an int >= 1, got 0"),
        ({"iterations": 1.5}, "aggregator.iterations: must be an int >= 1, got 1.5"),
        ({"start": "last"}, "aggregator.start: must be previous or zero, got 'last'"),
    ],
)
def test_bad_options_are_refused_in_one_line(options, message):
    options = {"tau": 100.0, "iterations": 1, "start": "previous", **options}
    with pytest.raises(ConfigError) as err:
        check_aggregator(partial(centered_clip.__wrapped__, **options), _Vectors())
    assert str(err.value) == message


def test_an_algorithm_that_keeps_no_previous_output_is_refused():
    class Ranked:
        upload_type = Weights

    options = {"tau": 100.0, "iterations": 1, "start": "previous"}
    with pytest.raises(ConfigError) as err:
        check_aggregator(partial(centered_clip.__wrapped__, **options), Ranked())
    assert str(err.value) == (
        "aggregator: centered_clip needs its previous output kept between rounds, which Ranked "
        "does not give it (FedAvg and the algorithms built on it do)"
    )


def test_fedavg_keeps_the_previous_aggregate_in_its_server_state():
    ctx = make_ctx(two_client_data())
    ctx.aggregator = partial(centered_clip, tau=0.01)  # clips the clients' steps (norms 0.16, 0.17)
    algo = FedAvg(ctx, "samples", 1.0, 0.0, **CONSTANT_SERVER_LR)
    state = algo.init_state()
    _, _, first, _ = one_round(algo, state=state)
    assert torch.allclose(first.buffers[PREVIOUS_KEY], first.params - state.params)
    assert PREVIOUS_KEY not in state.buffers  # the caller's state is left as it was
    _, results, second, _ = one_round(algo, state=first, round_idx=2)
    step = centered_clip(
        results.uploads().vector, ONES[:2], tau=0.01, previous=first.buffers[PREVIOUS_KEY]
    )
    assert torch.allclose(second.params, first.params + step)
    assert torch.equal(second.buffers[PREVIOUS_KEY], step)
