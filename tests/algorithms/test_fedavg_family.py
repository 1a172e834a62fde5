import torch

from components import with_yaml
from fedexp.algorithms.fedavg import FedAvg
from fedexp.algorithms.fedprox import FedProx
from fedexp.algorithms.fedrep import FedRep
from fedexp.core.cohort import RoundResults
from fedexp.core.flat import flat_params
from fedexp.core.types import ClientResult, RoundContext, ServerState, Weights
from handworld import begin_one, make_ctx, one_round, small_mlp

FedAvg = with_yaml(FedAvg, "algorithm", "fedavg")
FedProx = with_yaml(FedProx, "algorithm", "fedprox")
FedRep = with_yaml(FedRep, "algorithm", "fedrep")


def test_fedavg_aggregate_on_hand_numbers(two_clients):
    algo = FedAvg(make_ctx(two_clients))
    state = ServerState(params=torch.tensor([1.0, 2.0]))
    results = RoundResults.of(
        [
            ClientResult(0, 1, Weights(torch.tensor([1.0, 0.0])), 0.0, 1),
            ClientResult(1, 3, Weights(torch.tensor([3.0, 2.0])), 0.0, 1),
        ]
    )
    ctx = RoundContext(1, (0, 1), 0)
    new, _ = algo.aggregate(state, results, ctx)
    assert torch.equal(new.params, torch.tensor([3.5, 3.5]))  # w + (1*[1,0] + 3*[3,2]) / 4
    algo.weighting = "uniform"
    assert torch.equal(algo.aggregate(state, results, ctx)[0].params, torch.tensor([3.0, 3.0]))
    algo.server_lr = 0.5
    assert torch.equal(algo.aggregate(state, results, ctx)[0].params, torch.tensor([2.0, 2.5]))


def test_fedavg_one_local_step_each_on_hand_numbers(two_clients):
    # zero weights: softmax = [.5, .5]; grad W = (p - onehot(y)) x^T; lr 0.1, one step each.
    # client 0 (x=[1,2], y=0): W = [[.05, .1], [-.05, -.1]], b = [.05, -.05]
    # client 1 (x=[2,0], y=1): W = [[-.1, 0], [.1, 0]],     b = [-.05, .05]
    _, results, new, _ = one_round(FedAvg(make_ctx(two_clients)), two_clients)
    expected_w = torch.tensor([[-0.025, 0.05], [0.025, -0.05]])
    assert torch.allclose(new.params[:4], expected_w.reshape(-1), atol=1e-7)
    assert torch.allclose(new.params[4:], torch.zeros(2), atol=1e-7)
    assert [r.num_steps for r in results] == [1, 1]
    assert torch.allclose(
        torch.stack([r.train_loss for r in results]), torch.log(torch.tensor([2.0, 2.0]))
    )


def test_fedprox_with_mu_zero_is_fedavg_bit_for_bit(two_clients):
    _, _, avg, _ = one_round(FedAvg(make_ctx(two_clients, factory=small_mlp, seed=3)), two_clients)
    _, _, prox, _ = one_round(
        FedProx(make_ctx(two_clients, factory=small_mlp, seed=3), mu=0.0), two_clients
    )
    assert torch.equal(avg.params, prox.params)


def test_fedprox_gradient_includes_mu_times_distance(two_clients):
    mu = 0.7
    algo = FedProx(make_ctx(two_clients, factory=small_mlp), mu=mu)
    state = algo.init_state()
    module = algo.client_module(0)
    begin_one(algo, 0, Weights(state.params))
    shift = 0.3
    with torch.no_grad():
        for p in module.model.parameters():
            p.add_(shift)
    batch = two_clients.train(0)
    module.zero_grad()
    module.task_loss(batch).backward()
    task_grads = [p.grad.clone() for p in module.model.parameters()]
    module.zero_grad()
    module.training_step(batch, 0).backward()
    for p, g in zip(module.model.parameters(), task_grads):
        assert torch.allclose(p.grad - g, torch.full_like(g, mu * shift), atol=1e-6)


def test_fedrep_heads_stay_on_clients_and_differ(two_clients):
    algo = FedRep(make_ctx(two_clients, factory=small_mlp), head_epochs=2, body_epochs=1)
    _, results, new, _ = one_round(algo, two_clients)
    body = sum(p.numel() for p in algo.eval_model.body.parameters())
    head = sum(p.numel() for p in algo.eval_model.head.parameters())
    assert all(r.upload.values.numel() == body for r in results)  # only the body travels
    assert new.params.numel() == body
    h0, h1 = algo.store.get(0), algo.store.get(1)
    assert h0.numel() == head and not torch.equal(h0, h1)
    assert algo.global_model(new) is None
    personal = algo.personal_model(new, 1)
    assert torch.equal(flat_params(list(personal.head.parameters())), h1)  # client 1's own head
    assert torch.equal(flat_params(list(personal.body.parameters())), new.params)


def test_fedavg_lays_the_shared_parameters_out_in_one_buffer(two_clients):
    algo = FedAvg(make_ctx(two_clients, factory=small_mlp, seed=3))
    _, _, fast, _ = one_round(algo, two_clients)
    for model in (algo.module.model, algo.eval_model):
        params = algo.shared(model)
        base, size = params[0].data_ptr(), params[0].element_size()
        offsets = [p.data_ptr() - base for p in params]
        assert offsets == [0, 8 * size, 12 * size, 20 * size]  # 8 + 4 + 8 + 2 floats in a row
    # the same round with the layout undone (per-tensor loads and reads): the same numbers
    slow_algo = FedAvg(make_ctx(two_clients, factory=small_mlp, seed=3))
    for model in (slow_algo.module.model, slow_algo.eval_model):
        for p in slow_algo.shared(model):
            p.data = p.data.clone()
    _, _, slow, _ = one_round(slow_algo, two_clients)
    assert torch.equal(fast.params, slow.params)
