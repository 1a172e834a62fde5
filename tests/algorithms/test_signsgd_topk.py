"""SignSGD and TopK on hand numbers."""

from __future__ import annotations

import pytest
import torch

from components import with_yaml
from fedexp.aggregators.sign_vote import sign_vote
from fedexp.algorithms.signsgd import SignSGD, to_signs
from fedexp.algorithms.topk import TopK, top_fraction
from fedexp.core.cohort import RoundResults
from fedexp.core.flat import flat_params
from fedexp.core.types import ClientResult, RoundContext, ServerState, Signs, SparseDelta, Weights
from handworld import begin_one, end_one, mlp_ctx, one_client

SignSGD = with_yaml(SignSGD, "algorithm", "signsgd")
TopK = with_yaml(TopK, "algorithm", "topk")

make_ctx = mlp_ctx


def test_signs_map_zero_to_plus_one():
    assert to_signs(torch.tensor([0.5, -0.1, 0.0])).tolist() == [1, -1, 1]


def test_signsgd_step_is_server_lr_times_the_majority_sign():
    algorithm = SignSGD(make_ctx(sign_vote), server_lr=0.5)
    state = ServerState(params=torch.zeros(3))
    votes = [[1, -1, 1], [1, -1, -1], [-1, -1, 1], [-1, 1, -1]]  # sums 0, -2, 0
    results = RoundResults.of(
        [
            ClientResult(c, 1, Signs(torch.tensor(v, dtype=torch.int8)), 0.0, 1)
            for c, v in enumerate(votes)
        ]
    )
    new, metrics = algorithm.aggregate(state, results, RoundContext(1, (0, 1, 2, 3), 0))
    assert torch.equal(new.params, torch.tensor([0.0, -0.5, 0.0]))
    assert metrics["signsgd/tied_fraction"] == pytest.approx(2 / 3)


def test_top_fraction_keeps_the_largest_magnitudes():
    sparse = top_fraction(torch.tensor([0.1, -5.0, 3.0, 0.2]), 0.5)
    assert sparse.indices.tolist() == [1, 2] and sparse.values.tolist() == [-5.0, 3.0]
    assert sparse.dense().tolist() == [0.0, -5.0, 3.0, 0.0]


def test_topk_error_feedback_keeps_what_was_not_sent():
    algorithm = TopK(make_ctx(), fraction=0.1, error_feedback=True)
    state = algorithm.init_state()
    payload = algorithm.configure_round(state, RoundContext(1, (0,), 0))[0]
    module = algorithm.client_module(0)
    module = begin_one(algorithm, 0, payload)
    with torch.no_grad():
        for p in module.model.parameters():
            p.add_(torch.linspace(-1, 1, p.numel()).view_as(p))
    update = torch.cat([torch.linspace(-1, 1, p.numel()) for p in module.model.parameters()])
    sent = end_one(algorithm, module, 0, payload)
    residual = algorithm.store.get(0)
    assert torch.allclose(sent.dense() + residual, update, atol=1e-6)
    assert residual[sent.indices].abs().sum() == 0
    # next round: the residual is added before selecting
    again = one_client(algorithm, 0, payload)
    assert torch.allclose(again.dense() + algorithm.store.get(0), residual, atol=1e-6)


def test_eavesdroppers_rebuild_topk_from_the_dense_upload_and_signsgd_from_one_vote():
    d = 4 * 5 + 5 + 5 * 3 + 3  # mlp 4 -> 5 -> 3
    topk = TopK(make_ctx(), fraction=0.1)
    upload = SparseDelta(torch.tensor([2.0, -3.0]), torch.tensor([0, 5]), d)
    rebuilt = topk.eavesdropped_model(Weights(torch.ones(d)), upload)
    expected = torch.ones(d)
    expected[0], expected[5] = 3.0, -2.0
    assert torch.equal(flat_params(list(rebuilt.parameters())), expected)

    signsgd = SignSGD(make_ctx(sign_vote), server_lr=0.5)
    signs = torch.tensor([1, -1] * (d // 2) + [1], dtype=torch.int8)
    rebuilt = signsgd.eavesdropped_model(Weights(torch.ones(d)), Signs(signs))
    # what the server would step to for this one client: 1 +- 0.5, not 1 +- 1
    assert torch.equal(flat_params(list(rebuilt.parameters())), 1 + 0.5 * signs.float())
