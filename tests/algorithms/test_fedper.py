import copy

import torch

from components import with_yaml
from fedexp.algorithms.fedper import FedPer
from fedexp.core.client import ClientModule
from fedexp.core.client_loop import train_local
from fedexp.core.flat import flat_params
from fedexp.core.seeding import client_generator
from fedexp.metrics.comm import FLOAT_BITS
from handworld import make_ctx, one_client_data, one_round, small_mlp

FedPer = with_yaml(FedPer, "algorithm", "fedper")


def rounds(algo, data, num_rounds, clients=(0,)):
    state = algo.init_state()
    results = []
    for t in range(1, num_rounds + 1):
        _, results, state, _ = one_round(algo, data, clients, round_idx=t, state=state)
    return state, results


def test_fedper_uploads_the_body_only_and_trains_in_one_joint_phase(two_clients):
    algo = FedPer(make_ctx(two_clients, factory=small_mlp, local_epochs=2))
    state, results = rounds(algo, two_clients, 1, clients=(0, 1))
    body = sum(p.numel() for p in algo.eval_model.body.parameters())  # 2*4 + 4 = 12
    head = sum(p.numel() for p in algo.eval_model.head.parameters())  # 4*2 + 2 = 10
    assert (body, head) == (12, 10)
    assert [r.upload.num_bits() for r in results] == [12 * FLOAT_BITS] * 2
    assert state.params.numel() == body
    phases = algo.client_module(0).phases()
    assert [(p.name, p.epochs) for p in phases] == [("all", 2)]
    assert len(phases[0].params) == 4  # body and head weights and biases together
    assert [r.num_steps for r in results] == [2, 2]  # one sample, batch 1, two epochs
    assert not torch.equal(algo.store.get(0), algo.store.get(1))  # each client's own head
    assert algo.global_model(state) is None


def test_one_client_two_rounds_equal_local_training_of_the_whole_model():
    data = one_client_data()
    algo = FedPer(make_ctx(data, factory=small_mlp, batch_size=2, local_epochs=2))
    init = copy.deepcopy(algo.eval_model)
    algo.init_state()
    init.load_state_dict(algo.eval_model.state_dict())
    state, _ = rounds(algo, data, 2)
    # the same model trained alone on the client's data, round 1's then round 2's shuffles
    reference = ClientModule(init, algo.ctx.client)
    for t in (1, 2):
        train_local(reference, *data.train(0), 2, client_generator(0, t, 0))
    personal = algo.personal_model(state, 0)
    ref_head = flat_params(list(init.head.parameters()))
    assert torch.equal(flat_params(list(personal.head.parameters())), ref_head)  # stored as is
    # the body goes through w + (w_k - w) on the server: equal up to float32 rounding
    ref_body = flat_params(list(init.body.parameters()))
    torch.testing.assert_close(state.params, ref_body, rtol=0, atol=1e-6)
