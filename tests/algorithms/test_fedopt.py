"""FedOpt's server step by hand: FedAdam, FedYogi, FedAdagrad."""

import pytest
import torch

from components import with_yaml
from fedexp.algorithms.fedopt import FedOpt, server_step
from fedexp.core.cohort import RoundResults
from fedexp.core.types import ClientResult, ConfigError, RoundContext, ServerState, Weights
from handworld import make_ctx

FedOpt = with_yaml(FedOpt, "algorithm", "fedopt")
T = torch.tensor


def one_client_round(algo, state, delta):
    result = ClientResult(0, 1, Weights(T(delta, dtype=torch.float64)), 0.0, 1)
    return algo.aggregate(state, RoundResults.of([result]), RoundContext(1, (0,), 0))[0]


def test_adam_step_by_hand():
    # m = .5*2 + .5*4 = 3, v = .75*3 + .25*16 = 6.25, step = 1 * 3 / (2.5 + .5) = 1
    step, m, v = server_step(
        "adam", T([4.0, -4.0]), T([2.0, -2.0]), T([3.0, 3.0]), 1.0, 0.5, 0.5, 0.75
    )
    assert torch.equal(m, T([3.0, -3.0])) and torch.equal(v, T([6.25, 6.25]))
    assert torch.equal(step, T([1.0, -1.0]))


def test_yogi_step_by_hand_moves_v_towards_delta_squared_by_a_fixed_amount():
    # v < delta^2: v = 5 + .25*16 = 9, m = .5*2 + .5*4 = 3, step = 3 / (3 + 1) = .75
    # v > delta^2: v = 26 - .25*4 = 25, m = .5*4 + .5*2 = 3, step = 3 / (5 + 1) = .5
    step, m, v = server_step(
        "yogi", T([4.0, 2.0]), T([2.0, 4.0]), T([5.0, 26.0]), 1.0, 1.0, 0.5, 0.75
    )
    assert torch.equal(v, T([9.0, 25.0])) and torch.equal(m, T([3.0, 3.0]))
    assert torch.equal(step, T([0.75, 0.5]))


def test_adagrad_step_by_hand_ignores_beta2():
    # m = .5*2 + .5*2 = 2, v = 5 + 4 = 9, step = 2 * 2 / (3 + 1) = 1, whatever beta2
    for beta2 in (0.0, 0.99):
        step, m, v = server_step("adagrad", T([2.0]), T([2.0]), T([5.0]), 2.0, 1.0, 0.5, beta2)
        assert torch.equal(v, T([9.0])) and torch.equal(m, T([2.0]))
        assert torch.equal(step, T([1.0]))


def test_fedadagrad_with_defaults_over_three_rounds(two_clients):
    # eta = .01, tau = 1e-3, beta1 = .9, m_{-1} = 0, v_{-1} = tau^2 = 1e-6; deltas per round:
    # [1, -2], [3, 0], [-1, 2].  Coordinate 0: m = .1, .39, .251; v = 1, 10, 11 (+1e-6)
    #   x1 = .01 * .1 / (1.0000005 + .001) = 9.990005e-4
    #   x2 = x1 + .01 * .39 / (sqrt(10.000001) + .001) = 2.2318988e-3
    #   x3 = x2 + .01 * .251 / (sqrt(11.000001) + .001) = 2.9884642e-3
    # Coordinate 1: m = -.2, -.18, .038; v = 4, 4, 8 (+1e-6)
    #   x1 = -.002 / 2.001 = -9.995001e-4, x2 = x1 - .0018 / 2.001 = -1.8990502e-3
    #   x3 = x2 + .00038 / (sqrt(8.000001) + .001) = -1.7647474e-3
    algo = FedOpt(make_ctx(two_clients), server_optimizer="adagrad")
    state = ServerState(T([0.0, 0.0], dtype=torch.float64))
    state.buffers.update(m=torch.zeros(2, dtype=torch.float64), v=torch.full((2,), 1e-6).double())
    expected = [
        [9.990005e-4, -9.995001e-4],
        [2.2318988e-3, -1.8990502e-3],
        [2.9884642e-3, -1.7647474e-3],
    ]
    for delta, want in zip([[1.0, -2.0], [3.0, 0.0], [-1.0, 2.0]], expected):
        state = one_client_round(algo, state, delta)
        assert torch.allclose(state.params, T(want, dtype=torch.float64), rtol=1e-6, atol=0)


def test_init_state_starts_v_at_tau_squared_and_m_at_zero(two_clients):
    algo = FedOpt(make_ctx(two_clients), server_optimizer="yogi", tau=0.5)
    state = algo.init_state()
    assert torch.equal(state.buffers["m"], torch.zeros_like(state.params))
    assert torch.equal(state.buffers["v"], torch.full_like(state.params, 0.25))


def test_pseudo_gradient_is_algorithm_2s_plain_mean_and_by_option_the_weighted_one(two_clients):
    # clients of 1 and 3 samples; adam with beta1 = beta2 = 0, tau = 1: m = delta,
    # v = delta^2, step = delta / (|delta| + 1)
    # uniform (default): delta = ([1, 0] + [3, 2]) / 2 = [2, 1]       -> step [2/3, 1/2]
    # samples:           delta = (1*[1, 0] + 3*[3, 2]) / 4 = [2.5, 1.5] -> [2.5/3.5, 1.5/2.5]
    state = ServerState(T([0.0, 0.0]), {"m": torch.zeros(2), "v": torch.ones(2)})
    results = RoundResults.of(
        [
            ClientResult(0, 1, Weights(T([1.0, 0.0])), 0.0, 1),
            ClientResult(1, 3, Weights(T([3.0, 2.0])), 0.0, 1),
        ]
    )
    hand = {"uniform": T([2 / 3, 1 / 2]), "samples": T([2.5 / 3.5, 1.5 / 2.5])}
    for weighting in (None, "samples"):
        options = dict(beta1=0.0, beta2=0.0, tau=1.0, server_lr=1.0)
        if weighting:
            options["weighting"] = weighting
        algo = FedOpt(make_ctx(two_clients), **options)
        new, _ = algo.aggregate(state, results, RoundContext(1, (0, 1), 0))
        assert torch.allclose(new.params, hand[weighting or "uniform"], atol=1e-7)
    assert torch.equal(state.buffers["m"], torch.zeros(2))  # the input state is untouched


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ({"server_optimizer": "sgd"}, "algorithm.server_optimizer"),
        ({"tau": 0.0}, "algorithm.tau"),
        ({"beta1": 1.0}, "algorithm.beta1"),
        ({"beta2": -0.1}, "algorithm.beta2"),
        ({"server_lr": 0.0}, "algorithm.server_lr"),
    ],
)
def test_bad_options_are_config_errors(two_clients, override, key):
    with pytest.raises(ConfigError, match=key):
        FedOpt(make_ctx(two_clients), **override)
