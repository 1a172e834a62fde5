"""`algorithm.server_lr_schedule` of FedAvg / FedAvgM and FedOpt: the server lr of round t
(`ctx.round`) in the server step, by hand; bad values refused; reported as train/server_lr."""

from __future__ import annotations

import pytest
import torch

from components import with_yaml
from fedexp.algorithms.fedavg import FedAvg
from fedexp.algorithms.fedopt import FedOpt, server_step
from fedexp.core.cohort import RoundResults
from fedexp.core.types import ClientResult, ConfigError, RoundContext, ServerState, Weights
from handworld import make_ctx

FedAvg = with_yaml(FedAvg, "algorithm", "fedavg")
FedOpt = with_yaml(FedOpt, "algorithm", "fedopt")


def uploads() -> RoundResults:
    # uniform weights: the aggregated update is the mean [2, 1]
    return RoundResults.of(
        [
            ClientResult(0, 1, Weights(torch.tensor([1.0, 0.0])), 0.0, 1),
            ClientResult(1, 3, Weights(torch.tensor([3.0, 2.0])), 0.0, 1),
        ]
    )


def test_fedavgm_steps_at_each_rounds_server_lr_by_hand(two_clients):
    # step schedule, γ = 0.5 every round (S = 1): server lr 0.5 in round 1, 0.25 in round 2.
    # v1 = [2, 1], w1 = [1, 2] + 0.5·[2, 1] = [2, 2.5];
    # v2 = 0.9·[2, 1] + [2, 1] = [3.8, 1.9], w2 = [2, 2.5] + 0.25·[3.8, 1.9] = [2.95, 2.975]
    algo = FedAvg(
        make_ctx(two_clients),
        weighting="uniform",
        server_lr=0.5,
        server_momentum=0.9,
        server_lr_schedule="step",
        server_lr_decay=0.5,
        server_lr_step_rounds=1,
    )
    state = ServerState(params=torch.tensor([1.0, 2.0]))
    one, _ = algo.aggregate(state, uploads(), RoundContext(1, (0, 1), 0))
    assert torch.allclose(one.params, torch.tensor([2.0, 2.5]), atol=1e-7)
    two, _ = algo.aggregate(one, uploads(), RoundContext(2, (0, 1), 0))
    assert torch.allclose(two.params, torch.tensor([2.95, 2.975]), atol=1e-6)
    assert [algo.round_lrs(t)["train/server_lr"] for t in (1, 2, 3)] == [0.5, 0.25, 0.125]


def test_fedavg_constant_server_lr_is_as_before(two_clients):
    algo = FedAvg(make_ctx(two_clients), weighting="uniform", server_lr=0.5)
    state = ServerState(params=torch.tensor([1.0, 2.0]))
    new, _ = algo.aggregate(state, uploads(), RoundContext(40, (0, 1), 0))
    assert torch.equal(new.params, torch.tensor([1.0, 2.0]) + 0.5 * torch.tensor([2.0, 1.0]))
    assert algo.round_lrs(40)["train/server_lr"] == 0.5


def test_fedopt_steps_at_the_rounds_eta(two_clients):
    # warm-up over W = 4 rounds: round 2 steps at eta·2/4 = 0.005
    algo = FedOpt(
        make_ctx(two_clients), server_lr=0.01, server_lr_schedule="warmup",
        server_lr_warmup_rounds=4,
    )  # fmt: skip
    state = algo.init_state()
    state = ServerState(torch.tensor([1.0, 2.0]), {**state.buffers, "m": torch.zeros(2),
                                                   "v": torch.full((2,), 1e-6)})  # fmt: skip
    new, _ = algo.aggregate(state, uploads(), RoundContext(2, (0, 1), 0))
    delta = torch.tensor([2.0, 1.0])
    step, m, v = server_step("adam", delta, torch.zeros(2), torch.full((2,), 1e-6), 0.005,
                             1e-3, 0.9, 0.99)  # fmt: skip
    assert torch.equal(new.params, torch.tensor([1.0, 2.0]) + step)
    # by hand: m = 0.1·Δ, v = 0.99e-6 + 0.01·Δ², step = 0.005·m / (√v + 1e-3)
    hand = 0.005 * 0.1 * delta / ((0.99e-6 + 0.01 * delta**2).sqrt() + 1e-3)
    assert torch.allclose(step, hand, rtol=1e-6)
    assert algo.round_lrs(2)["train/server_lr"] == 0.005


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"server_lr_schedule": "linear"}, "algorithm.server_lr_schedule: must be one of"),
        ({"server_lr_decay": 0.0}, "algorithm.server_lr_decay: must be in (0, 1], got 0.0"),
        ({"server_lr_step_rounds": 0}, "algorithm.server_lr_step_rounds: must be >= 1"),
        ({"server_lr_min": -1.0}, "algorithm.server_lr_min: must be >= 0, got -1.0"),
        ({"server_lr_warmup_rounds": 0}, "algorithm.server_lr_warmup_rounds: must be >= 1"),
        ({"server_lr_schedule": "cosine"}, "algorithm.server_lr_schedule: cosine needs the run"),
    ],
)
def test_bad_server_schedules_are_refused(two_clients, change, message):
    with pytest.raises(ConfigError) as err:
        FedAvg(make_ctx(two_clients), **change)
    assert str(err.value).startswith(message), err.value


def test_server_cosine_anneals_over_the_runs_rounds(two_clients):
    from handworld import client_cfg

    ctx = make_ctx(two_clients, client=client_cfg(rounds=4))
    algo = FedAvg(ctx, server_lr=1.0, server_lr_schedule="cosine", server_lr_min=0.1)
    assert algo.server_lr_at(1) == 1.0
    assert algo.server_lr_at(3) == pytest.approx(0.55)
