import copy

import torch

from fedexp.algorithms.local import Local
from fedexp.core.client import ClientModule
from fedexp.core.client_loop import train_local
from fedexp.core.flat import flat_params
from fedexp.core.seeding import client_generator
from handworld import make_ctx, one_round, small_mlp


def run_rounds(algo, data, cohorts):
    state, bits = algo.init_state(), 0
    for t, ids in enumerate(cohorts, start=1):
        payloads, results, state, _ = one_round(algo, data, ids, round_idx=t, state=state)
        bits += sum(p.num_bits() for p in payloads.values())
        bits += sum(r.upload.num_bits() for r in results)
    return state, bits


def test_nothing_travels_and_there_is_no_global_model(two_clients):
    algo = Local(make_ctx(two_clients, factory=small_mlp))
    state, bits = run_rounds(algo, two_clients, [(0, 1), (0, 1)])
    assert bits == 0
    assert algo.global_model(state) is None
    assert algo.describe()["params/uploaded_per_client"] == 0
    assert not torch.equal(algo.store.get(0), algo.store.get(1))  # each client's own model


def test_two_rounds_equal_local_training_of_both_rounds_epochs_from_the_same_init(two_clients):
    algo = Local(make_ctx(two_clients, factory=small_mlp, local_epochs=3))
    state = algo.init_state()
    reference = copy.deepcopy(algo.eval_model)
    torch.nn.utils.vector_to_parameters(state.buffers["initial"], reference.parameters())
    # client 1 sampled in rounds 1 and 3, client 0 only in round 2
    state, _ = run_rounds(algo, two_clients, [(1,), (0,), (1,)])
    module = ClientModule(reference, algo.ctx.client)
    for t in (1, 3):  # the client's own shuffles of the rounds it was sampled in
        train_local(module, *two_clients.train(1), 1, client_generator(0, t, 1))
    assert torch.equal(
        flat_params(list(algo.personal_model(state, 1).parameters())),
        flat_params(list(reference.parameters())),
    )  # exactly: the model never leaves the client
    assert algo.module.client.local_epochs == 3
    # a client sampled once trained once; a never-sampled client would keep the initial model
    assert not torch.equal(algo.store.get(0), state.buffers["initial"])
    assert torch.equal(
        flat_params(list(algo.personal_model(state, 5).parameters())), state.buffers["initial"]
    )
