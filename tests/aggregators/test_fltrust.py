"""FLTrust: trust scores and rescaling by hand, and the server's own update on its pool."""

from __future__ import annotations

import math
from functools import partial

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from fedexp.aggregators import _warned
from fedexp.aggregators.fltrust import fltrust, trust_scores
from fedexp.algorithms.aggregation_inputs import server_update
from fedexp.algorithms.fedavg import CONSTANT_SERVER_LR, FedAvg
from fedexp.config.pool import pool_need
from fedexp.core.types import ConfigError, RoundContext
from fedexp.data.datasets import Dataset
from fedexp.data.federated import FederatedData
from fedexp.data.partition import Partition
from handworld import make_ctx, one_round

G0 = torch.tensor([3.0, 4.0])  # the server's update, norm 5
OPPOSITE, ORTHOGONAL, LONG = [-3.0, -4.0], [4.0, -3.0], [30.0, 40.0]


def test_opposite_orthogonal_and_a_long_aligned_update():
    # cosines -1, 0, 1: scores 0, 0, 1; the aligned one rescaled to norm 5 is g0 itself
    updates = torch.tensor([OPPOSITE, ORTHOGONAL, LONG])
    assert torch.equal(trust_scores(updates, G0), torch.tensor([0.0, 0.0, 1.0]))
    assert torch.allclose(fltrust(updates, torch.ones(3), reference=G0), G0)
    # with (5, 0) too: cosine 3/5, rescaled (5, 0); (1 (3, 4) + 0.6 (5, 0)) / 1.6 = (3.75, 2.5)
    updates = torch.tensor([OPPOSITE, ORTHOGONAL, LONG, [5.0, 0.0]])
    out = fltrust(updates, torch.tensor([1.0, 1.0, 1.0, 100.0]), reference=G0)  # weights unused
    assert torch.allclose(out, torch.tensor([3.75, 2.5]))


def test_a_client_cannot_gain_weight_by_scaling_its_update():
    updates = torch.tensor([[1.0, 2.0], [5.0, 0.0], [2.0, 2.0]])
    scaled = updates * torch.tensor([[1.0], [1000.0], [0.001]])
    out = fltrust(updates, torch.ones(3), reference=G0)
    assert torch.allclose(fltrust(scaled, torch.ones(3), reference=G0), out, atol=1e-6)


def test_every_score_zero_gives_a_zero_aggregate_and_says_so(caplog):
    _warned.discard("fltrust.zero")
    updates = torch.tensor([OPPOSITE, ORTHOGONAL, [0.0, 0.0]])  # a zero update scores 0 too
    with caplog.at_level("WARNING", logger="fedexp.aggregators"):
        out = fltrust(updates, torch.ones(3), reference=G0)
    assert torch.equal(out, torch.zeros(2))
    assert "every update had trust score 0" in caplog.text
    # a server update of norm 0: every score 0, no NaN
    assert torch.equal(fltrust(torch.tensor([LONG]), torch.ones(1), reference=torch.zeros(2)),
                       torch.zeros(2))  # fmt: skip


def test_without_the_server_pool_it_is_refused_in_one_line():
    check = fltrust.check_config
    with pytest.raises(ConfigError) as err:
        check(OmegaConf.create({"partition": {"server_pool": 0}}))
    assert str(err.value) == (
        "aggregator: fltrust trains the server's update on the server pool, but "
        "partition.server_pool=0; set partition.server_pool=100 (the paper's root dataset) or auto"
    )
    check(OmegaConf.create({"partition": {"server_pool": 16}}))
    # auto sets aside the paper's root dataset (the larger of the algorithm's and the aggregator's)
    cfg = {"algorithm": {"_target_": "fedexp.algorithms.fedavg.FedAvg"}}
    assert pool_need(OmegaConf.create(cfg)) == 0
    cfg["aggregator"] = {"_target_": "fedexp.aggregators.fltrust.fltrust"}
    assert pool_need(OmegaConf.create(cfg)) == 100


def pooled_two_clients(pool_x, pool_y):
    """Client 0 holds x=[1,2], y=0; client 1 x=[2,0], y=1; the server pool (pool_x, pool_y)."""
    x = torch.tensor([[1.0, 2.0], [2.0, 0.0]])
    y = torch.tensor([0, 1])
    ds = Dataset("hand", x, y, x.clone(), y.clone(), 2, (2,))
    ds.server_x, ds.server_y = torch.tensor(pool_x), torch.tensor(pool_y)
    part = Partition([np.array([0]), np.array([1])], [np.array([0]), np.array([1])])
    return FederatedData(ds, part, torch.device("cpu"))


def fedavg(data, aggregator=fltrust):
    ctx = make_ctx(data)  # a zero linear model 2 -> 2, SGD lr 0.1, batch 1, one epoch
    ctx.aggregator = partial(aggregator)
    return FedAvg(ctx, "samples", 1.0, 0.0, **CONSTANT_SERVER_LR)


def test_a_fedavg_round_by_hand():
    # From zero weights the softmax is (1/2, 1/2); one SGD step (lr 0.1) on (x, y) moves
    # W by -0.1 (p - e_y) x^T and b by -0.1 (p - e_y): for y = 0, W rows +0.05 x and -0.05 x.
    # Flat (W row 0, W row 1, b):
    #   server pool x = [1, 1], y = 0:  g0 = (.05, .05, -.05, -.05, .05, -.05), |g0|^2 = 0.015
    #   client 0    x = [1, 2], y = 0:  g1 = (.05, .1, -.05, -.1, .05, -.05),   |g1|^2 = 0.03
    #   client 1    x = [2, 0], y = 1:  g2 = (-.1, 0, .1, 0, -.05, .05)
    # g1.g0 = 0.02 > 0, g2.g0 = -0.015 < 0: only client 0 counts, rescaled to |g0|:
    # the new model is g1 |g0| / |g1| = g1 / sqrt(2)
    data = pooled_two_clients([[1.0, 1.0]], [0])
    algo = fedavg(data)
    state = algo.init_state()
    g0 = server_update(algo, state, RoundContext(1, (0, 1), 0))
    assert torch.allclose(g0, torch.tensor([0.05, 0.05, -0.05, -0.05, 0.05, -0.05]), atol=1e-7)
    _, _, new, _ = one_round(algo, state=state)
    g1 = torch.tensor([0.05, 0.1, -0.05, -0.1, 0.05, -0.05])
    assert torch.allclose(new.params, g1 / math.sqrt(2), atol=1e-7)


def test_the_server_update_is_seeded_and_leaves_the_run_as_it_was():
    g = torch.Generator().manual_seed(0)
    pool_x, pool_y = torch.randn(12, 2, generator=g), torch.randint(0, 2, (12,), generator=g)
    data = pooled_two_clients(pool_x.tolist(), pool_y.tolist())
    algo = fedavg(data)
    ctx = RoundContext(3, (0, 1), 7)
    state = algo.init_state()
    torch.manual_seed(123)
    before = torch.random.get_rng_state()
    first = server_update(algo, state, ctx)
    assert torch.equal(torch.random.get_rng_state(), before)  # the global RNG put back
    assert len(algo.store) == 0  # no store entry left behind
    assert torch.equal(server_update(algo, state, ctx), first)  # same seed, round: same update
    other = server_update(algo, state, RoundContext(4, (0, 1), 7))
    assert not torch.equal(other, first)  # another round: another shuffle of 12 in batches of 1
    # and a round with FLTrust equals the round of the same clients with it run beforehand
    _, results, _, _ = one_round(algo, state=state, aggregate=False)
    _, again, _, _ = one_round(fedavg(data), state=state, aggregate=False)
    assert torch.equal(results.uploads().vector, again.uploads().vector)


def test_the_server_pool_keeps_the_labels_of_its_samples():
    from fedexp.data.server_pool import reserve_server_pool

    x = torch.arange(20.0).reshape(10, 2)  # sample i is (2i, 2i + 1)
    y = torch.arange(10) % 3
    ds = reserve_server_pool(Dataset("hand", x, y, None, None, 3, (2,)), 4, seed=0)
    assert len(ds.server_x) == 4 and len(ds.train_y) == 6
    rows = (ds.server_x[:, 0] / 2).long()
    assert torch.equal(ds.server_y, rows % 3)  # each pooled input with its own label
