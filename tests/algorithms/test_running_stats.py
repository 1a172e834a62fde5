"""BatchNorm running statistics travel with the layers they normalise, and are averaged."""

import numpy as np
import pytest
import torch

from components import with_yaml
from fedexp.algorithms.ditto import Ditto
from fedexp.algorithms.dp_fedavg import DPFedAvg
from fedexp.algorithms.fedavg import FedAvg
from fedexp.algorithms.fedbn import FedBN
from fedexp.algorithms.fedhenn import fedhenn
from fedexp.algorithms.fedopt import FedOpt
from fedexp.algorithms.fedprox import FedProx
from fedexp.algorithms.fedrep import FedRep
from fedexp.algorithms.local import Local
from fedexp.algorithms.scaffold import Scaffold
from fedexp.attacks import NoAttack
from fedexp.core.types import ConfigError
from fedexp.data.datasets import Dataset
from fedexp.data.federated import FederatedData
from fedexp.data.partition import Partition
from fedexp.engine.executors.sequential import SequentialExecutor
from fedexp.engine.orchestrator import Orchestrator
from handworld import bn_mlp, make_ctx, one_round

FedAvg = with_yaml(FedAvg, "algorithm", "fedavg")
FedProx = with_yaml(FedProx, "algorithm", "fedprox")
Scaffold = with_yaml(Scaffold, "algorithm", "scaffold")
FedOpt = with_yaml(FedOpt, "algorithm", "fedopt")
FedBN = with_yaml(FedBN, "algorithm", "fedbn")
FedRep = with_yaml(FedRep, "algorithm", "fedrep")
Ditto = with_yaml(Ditto, "algorithm", "ditto")
fedhenn = with_yaml(fedhenn, "algorithm", "fedhenn")
DPFedAvg = with_yaml(DPFedAvg, "algorithm", "dp_fedavg")


def unequal_pairs():
    """Client 0 holds 2 samples, client 1 holds 3 (labels mixed): weights 2/5 and 3/5."""
    x = torch.tensor([[1.0, 2.0], [3.0, 0.0], [0.0, 1.0], [2.0, 5.0], [-1.0, 4.0]])
    y = torch.tensor([0, 1, 0, 1, 1])
    ds = Dataset("pairs", x, y, x.clone(), y.clone(), 2, (2,))
    part = Partition([np.array([0, 1]), np.array([2, 3, 4])], [np.array([0]), np.array([2])])
    return FederatedData(ds, part, torch.device("cpu"))


def run_round(algo, data, state, t=1):
    algo.broadcast_stats(state)  # as the round loop does
    _, results, new, _ = one_round(algo, data, state=state, round_idx=t)
    return results, new


def client_stats_by_hand(w, b, x, prior_mean, prior_var, prior_count):
    """One full-batch training step's BN update from the given prior (momentum 0.1)."""
    z = x @ w.T + b
    mean = 0.9 * prior_mean + 0.1 * z.mean(0)
    var = 0.9 * prior_var + 0.1 * z.var(0, unbiased=True)
    return torch.cat([mean, var, torch.tensor([prior_count + 1.0])])


@pytest.mark.parametrize("cls", [FedAvg, FedProx, Scaffold, FedOpt])
def test_global_statistics_are_the_clients_weighted_mean_by_hand(cls):
    data = unequal_pairs()
    algo = cls(make_ctx(data, factory=bn_mlp, batch_size=4))  # one full-batch step each
    state = algo.init_state()
    # the initial statistics travel: mean 0, variance 1, no batch
    assert torch.equal(state.buffers["stats"], torch.tensor([0.0] * 3 + [1.0] * 3 + [0.0]))
    lin = algo.eval_model.body[0]
    w0, b0 = lin.weight.detach().clone(), lin.bias.detach().clone()
    results, new = run_round(algo, data, state)
    expected = []
    for r in results:
        x, _ = data.train(r.client_id)
        by_hand = client_stats_by_hand(w0, b0, x, torch.zeros(3), torch.ones(3), 0)
        torch.testing.assert_close(r.stats, by_hand, rtol=0, atol=1e-6)
        expected.append(by_hand)
    # weights n_k / n (FedOpt: its own weighting, uniform or samples, the same as its deltas)
    p = algo.client_weights(results).float()
    p = p / p.sum()
    torch.testing.assert_close(new.buffers["stats"], p[0] * expected[0] + p[1] * expected[1])
    # the global model is evaluated with them, the batch count rounded back to an integer
    bn = algo.global_model(new).body[1]
    torch.testing.assert_close(bn.running_mean, new.buffers["stats"][:3])
    torch.testing.assert_close(bn.running_var, new.buffers["stats"][3:6])
    assert bn.num_batches_tracked.dtype == torch.int64 and int(bn.num_batches_tracked) == 1


def test_clients_trained_one_after_another_start_from_the_same_statistics():
    data = unequal_pairs()
    algo = FedAvg(make_ctx(data, factory=bn_mlp, batch_size=4))
    state = algo.init_state()
    _, state = run_round(algo, data, state)  # statistics no longer the initial ones
    seen = {}
    begin = algo.begin

    def spy(module, client_ids, payloads, stats):
        start = begin(module, client_ids, payloads, stats)
        for i, cid in enumerate(client_ids):
            seen[cid] = start.params["model.body.1.running_mean"][i].clone()
        return start

    algo.begin = spy
    run_round(algo, data, state, t=2)
    # client 1 trained after client 0 on the same resident module: it still starts from the
    # global statistics, not from those client 0 left
    assert torch.equal(seen[0], state.buffers["stats"][:3])
    assert torch.equal(seen[1], state.buffers["stats"][:3])


def test_the_ledger_counts_statistics_both_ways():
    data = unequal_pairs()
    algo = FedAvg(make_ctx(data, factory=bn_mlp, batch_size=4))
    loop = Orchestrator(
        algo, SequentialExecutor(), data, NoAttack(0.0, False), seed=0, rounds=1,
        clients_per_round=2, eval_every=1,
    )  # fmt: skip
    _, metrics = loop.run_round(algo.init_state(), 1)
    # 2 clients x (23 parameters + 7 statistics) x 32 bits, each way
    assert metrics["comm/up_bits"] == 2 * 30 * 32
    assert metrics["comm/down_bits"] == 2 * 30 * 32
    assert algo.describe()["params/running_stats_per_client"] == 7


def test_fedbn_keeps_statistics_on_the_client():
    data = unequal_pairs()
    algo = FedBN(make_ctx(data, factory=bn_mlp, batch_size=4))
    state = algo.init_state()
    results, new = run_round(algo, data, state)
    assert "stats" not in state.buffers and "stats" not in new.buffers
    assert all(r.stats is None for r in results)


def test_fedrep_shares_the_body_statistics_and_evaluates_with_them():
    data = unequal_pairs()
    algo = FedRep(make_ctx(data, factory=bn_mlp, batch_size=4))
    state = algo.init_state()
    results, new = run_round(algo, data, state)
    assert all(r.stats is not None and r.stats.numel() == 7 for r in results)
    bn = algo.personal_model(new, 1).body[1]
    torch.testing.assert_close(bn.running_mean, new.buffers["stats"][:3])


def fedhenn_eta0(ctx):
    return fedhenn(ctx, eta0=0.0, rad_source="noise")


@pytest.mark.parametrize("cls", [Local, Ditto, fedhenn_eta0])
def test_personal_models_keep_their_own_statistics(cls):
    data = unequal_pairs()
    algo = cls(make_ctx(data, factory=bn_mlp, batch_size=4))
    state = algo.init_state()
    _, new = run_round(algo, data, state)
    means = [algo.personal_model(new, c).body[1].running_mean.clone() for c in (0, 1)]
    assert not torch.equal(means[0], means[1])  # each client's data, not the last trained
    for c in (0, 1):  # and each is the statistics of that client's own training
        algo2 = cls(make_ctx(data, factory=bn_mlp, batch_size=4))
        s2 = algo2.init_state()
        algo2.broadcast_stats(s2)
        one_round(algo2, data, ids=(c,), state=s2, aggregate=False)
        torch.testing.assert_close(algo2.personal_model(s2, c).body[1].running_mean, means[c])


def test_dp_fedavg_refuses_statistics_it_cannot_privatise():
    data = unequal_pairs()
    with pytest.raises(ConfigError, match="BatchNorm running statistics"):
        DPFedAvg(make_ctx(data, factory=bn_mlp, batch_size=4), clip=1.0, noise_multiplier=1.0)
    # without clipping or noise it is FedAvg, statistics included
    dp = DPFedAvg(make_ctx(data, factory=bn_mlp, batch_size=4), clip=None, noise_multiplier=0.0)
    fa = FedAvg(make_ctx(data, factory=bn_mlp, batch_size=4), weighting=dp.weighting)
    _, a = run_round(dp, data, dp.init_state())
    _, b = run_round(fa, data, fa.init_state())
    assert torch.equal(a.buffers["stats"], b.buffers["stats"])
