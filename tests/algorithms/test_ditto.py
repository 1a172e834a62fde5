import copy

import pytest
import torch

from components import with_yaml
from fedexp.algorithms.ditto import Ditto
from fedexp.algorithms.fedavg import FedAvg
from fedexp.core.client import ClientModule
from fedexp.core.client_loop import train_local
from fedexp.core.flat import flat_params
from fedexp.core.seeding import client_generator
from fedexp.core.types import ConfigError
from handworld import make_ctx, one_client_data, one_round, small_mlp

Ditto = with_yaml(Ditto, "algorithm", "ditto")
FedAvg = with_yaml(FedAvg, "algorithm", "fedavg")


def rounds(algo, data, num_rounds):
    state = algo.init_state()
    anchors = []
    for t in range(1, num_rounds + 1):
        anchors.append(state.params)
        _, _, state, _ = one_round(algo, data, ids=(0,), round_idx=t, state=state)
    return state, anchors


def personal(algo, state, cid=0):
    return flat_params(list(algo.personal_model(state, cid).parameters()))


def test_lam_zero_personal_model_is_plain_local_training_step_for_step():
    data = one_client_data(n=5)  # batches of 2: 3 steps per epoch, the last one short
    cfg = dict(factory=small_mlp, batch_size=2, local_epochs=2, seed=4)
    algo = Ditto(make_ctx(data, **cfg), lam=0.0, personal_epochs=3)
    state, _ = rounds(algo, data, 2)
    # the same model trained alone from w^0: each round the global phase's 2 shuffles come
    # first on the client's stream, then the personal phase's 3 epochs
    reference = copy.deepcopy(algo.eval_model)
    torch.nn.utils.vector_to_parameters(algo.init_state().params, reference.parameters())
    module = ClientModule(reference, algo.ctx.client)
    module._local_epochs = 3
    for t in (1, 2):
        g = client_generator(0, t, 0)
        for _ in range(2):
            torch.randperm(5, generator=g)
        train_local(module, *data.train(0), 2, g)
    assert torch.equal(personal(algo, state), flat_params(list(reference.parameters())))


def test_very_large_lam_keeps_the_personal_model_at_the_rounds_global_model():
    data = one_client_data(n=5)
    # lr * lam = 1: each personal step lands at w^t - lr * grad F(v), within lr |grad| of w^t
    cfg = dict(factory=small_mlp, batch_size=2, lr=0.001, seed=4)
    far = Ditto(make_ctx(data, **cfg), lam=0.0, personal_epochs=50)
    near = Ditto(make_ctx(data, **cfg), lam=1000.0, personal_epochs=50)
    (s_far, anchors), (s_near, _) = rounds(far, data, 1), rounds(near, data, 1)
    gap_far = (personal(far, s_far) - anchors[0]).abs().max()
    gap_near = (personal(near, s_near) - anchors[0]).abs().max()
    assert gap_near < 2e-3  # lr * |grad| of a cross-entropy on O(1) inputs
    assert gap_near < gap_far / 10


def test_global_model_is_fedavgs_and_metrics_read_each_model(two_clients):
    ctx = dict(factory=small_mlp, seed=2)
    ditto = Ditto(make_ctx(two_clients, **ctx), lam=0.5, personal_epochs=2)
    fedavg = FedAvg(make_ctx(two_clients, **ctx))
    states = []
    for algo in (ditto, fedavg):
        _, results, new, _ = one_round(algo, two_clients)
        states.append(new)
        assert [r.num_steps for r in results] == ([3, 3] if algo is ditto else [1, 1])
    assert torch.equal(states[0].params, states[1].params)  # the global phase is FedAvg's
    glob = flat_params(list(ditto.global_model(states[0]).parameters()))
    assert torch.equal(glob, states[0].params)
    assert torch.equal(personal(ditto, states[0], 1), ditto.store.get(1))
    assert not torch.equal(ditto.store.get(0), ditto.store.get(1))
    assert torch.equal(personal(ditto, states[0], 7), states[0].buffers["initial"])  # unseen


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"lam": -1.0}, "algorithm.lam: must be a number >= 0"),
        ({"personal_epochs": 0}, "algorithm.personal_epochs: must be >= 1"),
        ({"personal_epochs": 1.5}, "algorithm.personal_epochs: must be int"),
    ],
)
def test_bad_options_are_config_errors(two_clients, options, message):
    with pytest.raises(ConfigError, match=message):
        Ditto(make_ctx(two_clients), **options)
