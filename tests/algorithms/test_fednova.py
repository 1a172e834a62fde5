"""FedNova: the normaliser by hand, the server step by hand, and FedAvg where every client takes
the same steps."""

import pytest
import torch

from components import with_yaml
from fedexp.algorithms.fedavg import FedAvg
from fedexp.algorithms.fednova import FedNova, NormalizedDelta, normalizer
from fedexp.core.cohort import RoundResults
from fedexp.core.types import ClientResult, ConfigError, RoundContext, ServerState
from handworld import make_ctx, one_client, one_round, small_mlp

FedAvg = with_yaml(FedAvg, "algorithm", "fedavg")
FedNova = with_yaml(FedNova, "algorithm", "fednova")


def test_the_normaliser_is_the_steps_and_with_momentum_the_sum_of_the_coefficients():
    steps = torch.tensor([0.0, 1.0, 2.0, 4.0])
    assert normalizer(steps, 0.0).tolist() == [0.0, 1.0, 2.0, 4.0]
    # rho = 0.5, tau = 2: a = [(1 - 0.25) / 0.5, 1] = [1.5, 1], ||a||_1 = 2.5
    assert normalizer(steps, 0.5)[2].item() == pytest.approx(2.5)
    assert normalizer(steps, 0.5)[1].item() == pytest.approx(1.0)  # one step: 1


def test_server_step_is_tau_eff_times_the_weighted_normalised_updates(two_clients):
    algo = FedNova(make_ctx(two_clients))
    state = ServerState(params=torch.tensor([1.0, 2.0]))
    uploads = [
        ClientResult(0, 1, NormalizedDelta(torch.tensor([1.0, 0.0]), torch.tensor(2.0)), 0.0, 2),
        ClientResult(1, 3, NormalizedDelta(torch.tensor([0.0, 1.0]), torch.tensor(4.0)), 0.0, 4),
    ]
    new, metrics = algo.aggregate(state, RoundResults.of(uploads), RoundContext(1, (0, 1), 0))
    # p = [1/4, 3/4]: tau_eff = 0.5 + 3 = 3.5; sum p_i d_i = [0.25, 0.75]
    assert metrics["fednova/tau_eff"] == pytest.approx(3.5)
    torch.testing.assert_close(new.params, torch.tensor([1.875, 4.625]))


def test_an_upload_is_the_delta_over_the_steps_taken(two_clients):
    algo = FedNova(make_ctx(two_clients, factory=small_mlp))
    state = algo.init_state()
    payload = algo.configure_round(state, RoundContext(1, (0,), 0))[0]
    untrained = one_client(algo, 0, payload)  # no step: no move, d = 0 (not 0 / 0)
    assert float(untrained.norm) == 0.0 and not untrained.values.any()
    _, results, _, _ = one_round(algo, ids=(0,), state=state, aggregate=False)
    (result,) = results
    assert result.num_steps == 1 and float(result.upload.norm) == 1.0
    assert result.upload.num_bits() == (state.params.numel() + 1) * 32


def test_with_equal_steps_fednova_is_fedavg(two_clients):
    # one sample a client, batch 1: every client takes the same single step
    ctx = dict(factory=small_mlp, seed=4)
    _, _, avg, _ = one_round(FedAvg(make_ctx(two_clients, **ctx)))
    _, _, nova, _ = one_round(FedNova(make_ctx(two_clients, **ctx)))
    torch.testing.assert_close(nova.params, avg.params, rtol=0, atol=1e-7)


def test_an_optimizer_other_than_sgd_is_refused(two_clients):
    with pytest.raises(ConfigError, match="client.optimizer: FedNova"):
        FedNova(make_ctx(two_clients, optimizer="adam"))
