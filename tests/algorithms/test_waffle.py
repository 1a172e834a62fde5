"""WAFFLe's server and client halves on a tiny federation."""

from __future__ import annotations

import dataclasses
from functools import partial

import numpy as np
import pytest
import torch

from components import with_yaml
from fedexp.algorithms.fedavg import FedAvg
from fedexp.algorithms.waffle import DictionaryPayload, WAFFLe
from fedexp.core.algorithm import BuildContext
from fedexp.core.cohort import RoundResults
from fedexp.core.flat import flat_params
from fedexp.core.local import ClientConfig
from fedexp.core.types import ClientResult, ConfigError, RoundContext, ServerState, Weights
from fedexp.data.federated import FederatedData
from fedexp.data.partition import Partition
from fedexp.models.cnn import lenet5
from fedexp.models.mlp import mlp
from handworld import make_ctx, one_round, tiny_federation

WAFFLe = with_yaml(WAFFLe, "algorithm", "waffle")
FedAvg = with_yaml(FedAvg, "algorithm", "fedavg")

CLIENT = ClientConfig(
    local_epochs=1, batch_size=10, optimizer="sgd", lr=0.1, momentum=0.0, weight_decay=0.0
)


def waffle_ctx(data=None, factory=None, client=CLIENT) -> BuildContext:
    """tiny_federation() and a 6-8-3 MLP unless given."""
    data = data or tiny_federation()
    factory = factory or partial(mlp, input_shape=data.input_shape, num_classes=3, hidden=(8,))
    return make_ctx(data, factory=factory, client=client)


def test_upload_is_the_dictionary_change_only():
    algo = WAFFLe(waffle_ctx(), num_factors=4, alpha=3.0, variational_lr=0.1)
    state = algo.init_state()
    payloads, results, _, _ = one_round(algo, state=state, aggregate=False)
    dictionary = sum(p.numel() for p in algo.eval_model.parameters())
    variational = len(algo.prior_variational)
    assert variational == 3 * 2 * 4  # {pi~, c, d} x 2 layers x F
    for r in results:
        assert type(r.upload) is Weights
        assert r.upload.values.numel() == dictionary
        assert r.upload.num_bits() == 32 * dictionary
        stored = algo.store.get(r.client_id)
        assert stored.numel() == variational
        assert not torch.equal(stored, algo.prior_variational)  # trained, but kept home
    # the upload is exactly the module's dictionary minus the broadcast one
    module = algo.client_module(1)
    assert torch.equal(
        results[1].upload.values, flat_params(list(module.model.parameters())) - payloads[1].values
    )
    assert payloads[0].num_bits() == 32 * dictionary + 32  # + the round's temperature


def test_server_takes_the_papers_simple_average_on_hand_numbers():
    # clients of 1 and 3 samples: w + ([1, 0] + [3, 2]) / 2 = [1, 2] + [2, 1] = [3, 3];
    # weighting=samples: [1, 2] + (1*[1, 0] + 3*[3, 2]) / 4 = [1, 2] + [2.5, 1.5] = [3.5, 3.5]
    state = ServerState(params=torch.tensor([1.0, 2.0]))
    results = RoundResults.of(
        [
            ClientResult(0, 1, Weights(torch.tensor([1.0, 0.0])), 0.0, 1),
            ClientResult(1, 3, Weights(torch.tensor([3.0, 2.0])), 0.0, 1),
        ]
    )
    ctx = RoundContext(1, (0, 1), 0)
    simple = WAFFLe(waffle_ctx(), num_factors=4).aggregate(state, results, ctx)[0]
    weighted = WAFFLe(waffle_ctx(), num_factors=4, weighting="samples").aggregate(
        state, results, ctx
    )
    assert torch.equal(simple.params, torch.tensor([3.0, 3.0]))
    assert torch.equal(weighted[0].params, torch.tensor([3.5, 3.5]))


def test_server_averages_the_uploads_of_unequal_clients_equally():
    full = tiny_federation(num_clients=2, per_client=30)
    sizes = [8, 24]  # the clients' training samples: client 0 keeps the first 8 of its 24
    train = [np.arange(8), np.arange(30, 54)]
    test = [np.arange(24, 30), np.arange(54, 60)]
    data = FederatedData(full.dataset, Partition(train, test), torch.device("cpu"))
    algo = WAFFLe(waffle_ctx(data), num_factors=4)
    state = algo.init_state()
    _, results, new, _ = one_round(algo, state=state)
    assert [r.num_samples for r in results] == sizes
    mean = (results[0].upload.values + results[1].upload.values) / 2
    assert torch.allclose(new.params, state.params + mean, atol=1e-6)


def test_factor_selection_gets_sparser_as_alpha_shrinks():
    active, expected = [], []
    for alpha in (1.0, 4.0, 16.0):
        algo = WAFFLe(
            waffle_ctx(client=dataclasses.replace(CLIENT, local_epochs=5)),
            num_factors=24,
            alpha=alpha,
            variational_lr=0.05,
        )
        state = algo.init_state()
        one_round(algo, ids=(0,), state=state, aggregate=False)
        algo.load_posterior(algo.store.get(0))
        pi = torch.sigmoid(algo.eval_posterior.pi_logit.detach())
        active.append(int((pi >= 0.5).sum()))
        expected.append(float(pi.sum()))
    assert active[0] < active[1] < active[2]
    assert expected[0] < expected[1] < expected[2]


def test_never_sampled_client_uses_the_global_model_and_trained_one_its_own_mask():
    algo = WAFFLe(waffle_ctx(), num_factors=4, variational_lr=0.5)
    state = algo.init_state()
    x = algo.ctx.data.test_x
    global_out = algo.global_model(state)(x)
    assert torch.equal(algo.personal_model(state, 2)(x), global_out)
    one_round(algo, ids=(0,), state=state, aggregate=False)
    personal = algo.personal_model(state, 0)
    masks = [layer.factor_mask for layer in personal.modules() if hasattr(layer, "w_a")]
    algo.load_posterior(algo.store.get(0))
    assert torch.equal(masks[0], (algo.eval_posterior.pi_logit[0] >= 0).float())
    algo_all = WAFFLe(waffle_ctx(), num_factors=4, unseen_mask="all")
    model = algo_all.global_model(algo_all.init_state())
    assert all(layer.factor_mask is None for layer in model.modules() if hasattr(layer, "w_a"))


def test_temperature_anneals_geometrically():
    algo = WAFFLe(waffle_ctx(), num_factors=2, tau=1.0, tau_final=0.25, tau_anneal_rounds=2)
    assert [algo.temperature(t) for t in (1, 2, 3, 10)] == [1.0, 0.5, 0.25, 0.25]
    payload = algo.configure_round(algo.init_state(), RoundContext(2, (0,), 0))[0]
    assert isinstance(payload, DictionaryPayload) and payload.temperature == 0.5


def test_describe_counts_fewer_uploaded_params_than_fedavg_on_lenet():
    factory = partial(lenet5, input_shape=(3, 32, 32), num_classes=10)
    algo = WAFFLe(waffle_ctx(factory=factory), num_factors=32)
    d = algo.describe()
    assert d["params/fedavg_model"] == 62006  # LeNet-5 on 3x32x32, by hand
    shapes = [(6, 75), (16, 150), (120, 400), (84, 120), (10, 84)]
    assert d["params/uploaded_per_client"] == sum(32 * (j + m + 1) + j for j, m in shapes)
    assert d["params/uploaded_per_client"] < d["params/fedavg_model"]
    assert d["params/variational_per_client"] == 3 * 5 * 32


def test_eavesdroppers_rebuild_fedavg_local_model_and_waffle_dictionary_without_b():
    fedavg = FedAvg(waffle_ctx())
    state = fedavg.init_state()
    payloads, results, _, _ = one_round(fedavg, ids=(0,), state=state, aggregate=False)
    local = flat_params(list(fedavg.client_module(0).model.parameters()))
    rebuilt = fedavg.eavesdropped_model(payloads[0], results[0].upload)
    assert torch.allclose(flat_params(list(rebuilt.parameters())), local, atol=1e-6)

    waffle = WAFFLe(waffle_ctx(), num_factors=4, variational_lr=0.5)
    state = waffle.init_state()
    payloads, results, _, _ = one_round(waffle, ids=(0,), state=state, aggregate=False)
    rebuilt = waffle.eavesdropped_model(payloads[0], results[0].upload)
    x = waffle.ctx.data.test_x
    out = rebuilt(x)
    assert torch.equal(
        out, waffle._with_dictionary(payloads[0].values + results[0].upload.values, None)(x)
    )


@pytest.mark.parametrize(
    "kwargs,key",
    [
        ({"alpha": 0}, "alpha"),
        ({"num_factors": 0}, "num_factors"),
        ({"eval_mask": "x"}, "eval_mask"),
    ],
)
def test_bad_options_are_config_errors(kwargs, key):
    with pytest.raises(ConfigError, match=f"algorithm.{key}"):
        WAFFLe(waffle_ctx(), **kwargs)
