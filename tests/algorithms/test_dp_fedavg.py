import json
import re
from functools import partial
from types import SimpleNamespace

import dp_accounting
import pytest
import torch

from components import with_yaml
from conftest import run_dirs
from fedexp.aggregators.median import median
from fedexp.algorithms.dp_fedavg import DP_NOISE_STREAM, DPFedAvg, clip_rows
from fedexp.algorithms.fedavg import FedAvg
from fedexp.core.cohort import RoundResults
from fedexp.core.seeding import derive_seed
from fedexp.core.types import ClientResult, ConfigError, RoundContext, ServerState, Weights
from handworld import make_ctx, one_round, small_mlp

DPFedAvg = with_yaml(DPFedAvg, "algorithm", "dp_fedavg")
FedAvg = with_yaml(FedAvg, "algorithm", "fedavg")


def stub_data(sizes):
    """What DP-FedAvg reads of the federation: N and every client's n_k."""
    return SimpleNamespace(num_clients=len(sizes), num_train=lambda c: sizes[c])


def results_of(*rows, sizes=None):
    sizes = sizes or [1] * len(rows)
    return RoundResults.of(
        [
            ClientResult(i, n, Weights(torch.tensor(row)), 0.0, 1)
            for i, (row, n) in enumerate(zip(rows, sizes))
        ]
    )


def test_no_noise_no_clip_uniform_is_fedavg_bit_for_bit(two_clients):
    _, _, avg, _ = one_round(
        FedAvg(make_ctx(two_clients, factory=small_mlp, seed=3), weighting="uniform"), two_clients
    )
    _, _, dp, metrics = one_round(
        DPFedAvg(make_ctx(two_clients, factory=small_mlp, seed=3), clip=None, noise_multiplier=0),
        two_clients,
    )
    assert torch.equal(avg.params, dp.params)
    assert metrics["privacy/epsilon"] == float("inf")


def test_clip_halves_an_update_of_norm_two():
    clipped, norms = clip_rows(torch.tensor([[1.2, 1.6], [0.3, 0.4], [0.0, 0.0]]), 1.0)
    assert torch.allclose(clipped, torch.tensor([[0.6, 0.8], [0.3, 0.4], [0.0, 0.0]]))
    assert torch.allclose(norms, torch.tensor([2.0, 0.5, 0.0]))


def test_aggregate_clips_then_averages_on_hand_numbers():
    algo = DPFedAvg(make_ctx(stub_data([1, 1])), clip=1.0, noise_multiplier=0)
    state = ServerState(params=torch.tensor([1.0, 1.0]))
    new, metrics = algo.aggregate(
        state, results_of([1.2, 1.6], [0.3, 0.4]), RoundContext(1, (0, 1), 0)
    )
    # clipped: [0.6, 0.8] and [0.3, 0.4]; their mean [0.45, 0.6]
    assert torch.allclose(new.params, torch.tensor([1.45, 1.6]))
    assert metrics["dp/clipped_fraction"] == 0.5
    assert metrics["dp/update_norm"] == pytest.approx(1.25)


def test_samples_weighting_is_the_papers_fixed_denominator():
    # N = 4 clients of n = 1, 2, 4, 8 and w_hat = 4: w = 1/4, 1/2, 1, 1; W = 2.75
    algo = DPFedAvg(
        make_ctx(stub_data([1, 2, 4, 8])),
        weighting="samples",
        weight_cap=4,
        clip=None,
        noise_multiplier=0,
    )
    state = ServerState(params=torch.zeros(2))
    # cohort {0, 3}: q W = (2 / 4) * 2.75 = 1.375; sum w_k D_k = 0.25 [2, 0] + 1 [0, 1.375]
    results = results_of([2.0, 0.0], [0.0, 1.375], sizes=[1, 8])
    new, _ = algo.aggregate(state, results, RoundContext(1, (0, 3), 0))
    assert torch.allclose(new.params, torch.tensor([0.5 / 1.375, 1.0]))


def test_noise_is_sigma_clip_over_cohort_from_the_rounds_seeded_stream():
    sigma, clip, d = 2.0, 0.5, 50_000
    algo = DPFedAvg(make_ctx(stub_data([1] * 4)), clip=clip, noise_multiplier=sigma)
    state = ServerState(params=torch.zeros(d))
    zero = results_of(*[[0.0] * d] * 2)
    ctx = RoundContext(7, (1, 2), 11)
    a, _ = algo.aggregate(state, zero, ctx)
    z = torch.randn(d, generator=torch.Generator().manual_seed(derive_seed(11, DP_NOISE_STREAM, 7)))
    assert torch.allclose(a.params, sigma * clip / 2 * z)  # std sigma S on the sum, / m = 2
    assert a.params.std().item() == pytest.approx(0.5, rel=0.02)
    b, _ = algo.aggregate(state, zero, ctx)
    assert torch.equal(a.params, b.params)  # same seed and round: the same draw
    c, _ = algo.aggregate(state, zero, RoundContext(8, (1, 2), 11))
    assert not torch.equal(a.params, c.params)


@pytest.mark.parametrize("accounting", ["without_replacement", "poisson"])
def test_epsilon_is_the_accountants_own(accounting):
    n, cohort, sigma, rounds, delta = 10, 3, 1.3, 4, 1e-5
    algo = DPFedAvg(
        make_ctx(stub_data([1] * n)), noise_multiplier=sigma, delta=delta, accounting=accounting
    )
    state = ServerState(params=torch.zeros(2))
    ctx = RoundContext(rounds, (0, 4, 7), 0)
    _, metrics = algo.aggregate(state, results_of([0.1, 0.0], [0.0, 0.1], [0.0, 0.0]), ctx)
    if accounting == "poisson":
        event = dp_accounting.PoissonSampledDpEvent(
            cohort / n, dp_accounting.GaussianDpEvent(sigma)
        )
        relation = dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE
    else:  # replace-one neighbours move the clipped sum by up to 2S: multiplier sigma / 2
        event = dp_accounting.SampledWithoutReplacementDpEvent(
            n, cohort, dp_accounting.GaussianDpEvent(sigma / 2)
        )
        relation = dp_accounting.NeighboringRelation.REPLACE_ONE
    accountant = dp_accounting.rdp.RdpAccountant(neighboring_relation=relation)
    accountant.compose(event, rounds)
    assert metrics["privacy/epsilon"] == pytest.approx(accountant.get_epsilon(delta), rel=1e-12)
    assert 0 < metrics["privacy/epsilon"] < float("inf")
    _, later = algo.aggregate(state, results_of([0.1], [0.0], [0.0]), RoundContext(8, (0, 4, 7), 0))
    assert later["privacy/epsilon"] > metrics["privacy/epsilon"]  # it grows with the rounds


BAD = [
    (dict(clip=0), "algorithm.clip: must be > 0 or null"),
    (dict(clip=None), "algorithm.noise_multiplier: noise is sigma * clip"),
    (dict(noise_multiplier=-1), "algorithm.noise_multiplier: must be in [0, 1e+06], got -1"),
    (dict(noise_multiplier=1e30), "algorithm.noise_multiplier: must be in [0, 1e+06], got 1e+30"),
    (dict(delta=1), "algorithm.delta: must be in (0, 1)"),
    (dict(accounting="rdp"), "algorithm.accounting: must be one of"),
    (dict(weight_cap=0), "algorithm.weight_cap: must be > 0 or null"),
]


@pytest.mark.parametrize("options,message", BAD)
def test_bad_options_are_config_errors(two_clients, options, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        DPFedAvg(make_ctx(two_clients), **options)


def test_a_robust_aggregator_is_refused(two_clients):
    ctx = make_ctx(two_clients)
    ctx.aggregator = partial(median)
    with pytest.raises(ConfigError, match="aggregator: .* needs aggregator=mean"):
        DPFedAvg(ctx)


def test_cli_logs_epsilon_every_round(cli_in_process):
    cli = cli_in_process
    cli("algorithm=dp_fedavg", "algorithm.noise_multiplier=0.8", "debug=smoke")
    (run,) = run_dirs(cli.cwd / "outputs")
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    event = dp_accounting.SampledWithoutReplacementDpEvent(
        6, 3, dp_accounting.GaussianDpEvent(0.4)
    )  # debug=smoke: 3 of 6 clients
    for row in rows:
        accountant = dp_accounting.rdp.RdpAccountant(
            neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE
        )
        accountant.compose(event, row["round"])
        assert row["privacy/epsilon"] == pytest.approx(accountant.get_epsilon(1e-5), rel=1e-12)
    assert [row["round"] for row in rows] == [1, 2]
