"""SCAFFOLD on the two-client hand world (zero linear model, lr 0.1, one step per round)."""

import pytest
import torch

from components import with_yaml
from fedexp.algorithms.fedavg import FedAvg
from fedexp.algorithms.scaffold import Scaffold, ScaffoldPayload, ScaffoldUpload
from fedexp.core.cohort import RoundResults
from fedexp.core.local import LocalTraining, PhaseTraining
from fedexp.core.types import ClientResult, ConfigError, RoundContext, ServerState
from handworld import begin_one, end_one, make_ctx, one_round, small_mlp

FedAvg = with_yaml(FedAvg, "algorithm", "fedavg")
Scaffold = with_yaml(Scaffold, "algorithm", "scaffold")

# round 1 from zero weights (see test_fedavg_family): the deltas y_i - x, flat [W (2x2), b]
D0 = torch.tensor([0.05, 0.1, -0.05, -0.1, 0.05, -0.05])
D1 = torch.tensor([-0.1, 0.0, 0.1, 0.0, -0.05, 0.05])


def test_first_round_is_fedavg_and_control_variates_follow_option_two(two_clients):
    algo = Scaffold(make_ctx(two_clients))
    _, results, new, _ = one_round(algo)
    # c = c_i = 0: the same weights as FedAvg, bit for bit
    avg = FedAvg(make_ctx(two_clients))
    assert torch.equal(new.params, one_round(avg)[2].params)
    assert torch.allclose(results[0].upload.delta, D0, atol=1e-7)
    assert torch.allclose(results[1].upload.delta, D1, atol=1e-7)
    # option II, K = 1, lr 0.1: c_i+ = 0 - 0 - (y_i - x) / 0.1 = -10 * delta
    c0, c1 = -10 * D0, -10 * D1
    assert torch.allclose(algo.store.get(0), c0, atol=1e-6)
    assert torch.allclose(algo.store.get(1), c1, atol=1e-6)
    assert torch.allclose(results[0].upload.control_delta, c0, atol=1e-6)
    # c <- 0 + (|S|/N) mean(dc) = (c0 + c1) / 2 with N = 2
    expected_c = torch.tensor([0.25, -0.5, -0.25, 0.5, 0.0, 0.0])
    assert torch.allclose(new.buffers["control"], expected_c, atol=1e-6)


def test_second_round_control_variate_is_the_gradient_at_x(two_clients):
    # one local step: y = x - lr (g(x) + c - c_i), so c_i+ = c_i - c + (x - y)/lr = g(x) exactly
    algo = Scaffold(make_ctx(two_clients))
    _, _, state, _ = one_round(algo)
    _, results, _, _ = one_round(algo, state=state, round_idx=2)
    # x1: W = [[-.025, .05], [.025, -.05]], b = 0; client 0 (x=[1,2], y=0): logits +-0.075
    p1 = torch.sigmoid(torch.tensor(-0.15)).item()  # softmax mass on the wrong class
    g0 = torch.tensor([-p1, -2 * p1, p1, 2 * p1, -p1, p1])
    assert torch.allclose(algo.store.get(0), g0, atol=1e-6)
    # and the step it took was corrected by c - c_0 = [.75, .5, -.75, -.5, .5, -.5]
    correction = torch.tensor([0.75, 0.5, -0.75, -0.5, 0.5, -0.5])
    assert torch.allclose(results[0].upload.delta, -0.1 * (g0 + correction), atol=1e-6)


def test_correction_adds_c_minus_ci_to_the_gradient_and_nothing_to_the_loss(two_clients):
    algo = Scaffold(make_ctx(two_clients, factory=small_mlp))
    state = algo.init_state()
    d = state.params.numel()
    c = torch.linspace(-1.0, 1.0, d)
    algo.store.put(0, torch.full((d,), 0.25))
    module = algo.client_module(0)
    module = begin_one(algo, 0, ScaffoldPayload(state.params, c))
    batch = two_clients.train(0)
    module.zero_grad()
    task = module.task_loss(batch)
    task.backward()
    task_grad = torch.cat([p.grad.reshape(-1) for p in module.model.parameters()])
    module.zero_grad()
    loss = module.training_step(batch, 0)
    loss.backward()
    grad = torch.cat([p.grad.reshape(-1) for p in module.model.parameters()])
    assert torch.equal(loss.detach(), task.detach())
    assert torch.allclose(grad - task_grad, c - 0.25, atol=1e-6)


def test_server_step_uses_eta_g_and_sampled_fraction_of_clients(two_clients):
    algo = Scaffold(make_ctx(two_clients), server_lr=0.5)
    state = ServerState(torch.tensor([1.0, 2.0]), {"control": torch.tensor([1.0, 1.0])})
    upload = ScaffoldUpload(torch.tensor([2.0, -4.0]), torch.tensor([4.0, 2.0]))
    results = RoundResults.of([ClientResult(0, 1, upload, 0.0, 1)])
    new, _ = algo.aggregate(state, results, RoundContext(1, (0,), 0))
    assert torch.equal(new.params, torch.tensor([2.0, 0.0]))  # x + 0.5 * [2, -4]
    assert torch.equal(new.buffers["control"], torch.tensor([3.0, 2.0]))  # c + (1/2) [4, 2]
    assert torch.equal(state.buffers["control"], torch.tensor([1.0, 1.0]))  # input untouched


def test_messages_count_both_vectors():
    v = torch.zeros(6)
    assert ScaffoldUpload(v, v).num_bits() == 2 * 6 * 32
    assert ScaffoldPayload(v, v).num_bits() == 2 * 6 * 32
    assert torch.equal(ScaffoldUpload(v, v).with_vector(v + 1).control_delta, v)  # attacks: delta


def test_per_group_learning_rates_are_refused(two_clients):
    algo = Scaffold(make_ctx(two_clients))
    state = algo.init_state()
    module = algo.client_module(0)
    payload = ScaffoldPayload(state.params, torch.zeros_like(state.params))
    module = begin_one(algo, 0, payload)
    training = LocalTraining(2, 1, torch.zeros(()), (PhaseTraining("all", 1, 2, (0.1, 0.2)),))
    with pytest.raises(ConfigError, match="client.optimizer"):
        end_one(algo, module, 0, payload, training)
