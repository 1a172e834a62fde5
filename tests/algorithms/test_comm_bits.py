"""Exact message sizes on a small model: 4 -> 5 -> 3 MLP (43 parameters, 35 edges)."""

from __future__ import annotations

import torch

from components import with_yaml
from fedexp.aggregators.rank_vote import rank_vote
from fedexp.aggregators.sign_vote import sign_vote
from fedexp.algorithms.fedavg import FedAvg
from fedexp.algorithms.frl import FRL
from fedexp.algorithms.signsgd import SignSGD
from fedexp.algorithms.topk import TopK
from fedexp.core.types import Ranking, RoundContext, Signs, SparseDelta
from fedexp.metrics.comm import index_bits, permutation_bits
from handworld import mlp_ctx, one_client

FedAvg = with_yaml(FedAvg, "algorithm", "fedavg")
SignSGD = with_yaml(SignSGD, "algorithm", "signsgd")
TopK = with_yaml(TopK, "algorithm", "topk")
FRL = with_yaml(FRL, "algorithm", "frl")

make_ctx = mlp_ctx


def one_exchange(algorithm) -> tuple[int, int]:
    """(down bits, up bits) of one client's round, without training."""
    state = algorithm.init_state()
    payload = algorithm.configure_round(state, RoundContext(1, (0,), 0))[0]
    return payload.num_bits(), one_client(algorithm, 0, payload).num_bits()


def test_index_and_permutation_bits():
    assert [index_bits(d) for d in (1, 2, 3, 4, 5, 1024, 1025)] == [0, 1, 2, 2, 3, 10, 11]
    assert permutation_bits(20) == 20 * 5


def test_fedavg_sends_32_bit_floats_both_ways():
    assert one_exchange(FedAvg(make_ctx())) == (43 * 32, 43 * 32)


def test_signsgd_uploads_one_bit_per_coordinate():
    algorithm = SignSGD(make_ctx(sign_vote))
    assert one_exchange(algorithm) == (43 * 32, 43)
    assert Signs(torch.ones(7, dtype=torch.int8)).num_bits() == 7


def test_topk_uploads_values_and_indices():
    # round(0.1 * 43) = 4 coordinates, each 32 value bits + ceil(log2 43) = 6 index bits
    assert one_exchange(TopK(make_ctx(), fraction=0.1)) == (43 * 32, 4 * (32 + 6))
    sparse = SparseDelta(torch.ones(3), torch.tensor([0, 5, 9]), 1000)
    assert sparse.num_bits() == 3 * (32 + 10)


def test_frl_rankings_cost_n_log2_n_per_layer():
    # biases dropped; edges: 4*5 = 20 (5 bits each) and 5*3 = 15 (4 bits each)
    assert one_exchange(FRL(make_ctx(rank_vote))) == (20 * 5 + 15 * 4, 20 * 5 + 15 * 4)
    assert Ranking((torch.arange(1),)).num_bits() == 0
