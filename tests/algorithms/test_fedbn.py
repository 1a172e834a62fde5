"""FedBN: BatchNorm layers never leave their client; the rest is FedAvg."""

import numpy as np
import pytest
import torch

from components import with_yaml
from conftest import main_in_process
from fedexp.algorithms.fedavg import FedAvg
from fedexp.algorithms.fedbn import FedBN, bn_layers
from fedexp.core.types import ConfigError, RoundContext
from fedexp.data.datasets import Dataset
from fedexp.data.federated import FederatedData
from fedexp.data.partition import Partition
from fedexp.engine.executors.vectorized import VectorizedExecutor
from handworld import begin_one, bn_mlp, make_ctx, one_round, small_mlp

FedAvg = with_yaml(FedAvg, "algorithm", "fedavg")
FedBN = with_yaml(FedBN, "algorithm", "fedbn")


def two_pairs():
    """Client 0 holds x=[1,2],[3,0]; client 1 holds x=[0,1],[2,5] (labels 0, 1 each)."""
    x = torch.tensor([[1.0, 2.0], [3.0, 0.0], [0.0, 1.0], [2.0, 5.0]])
    y = torch.tensor([0, 1, 0, 1])
    ds = Dataset("pairs", x, y, x.clone(), y.clone(), 2, (2,))
    part = Partition([np.array([0, 1]), np.array([2, 3])], [np.array([0]), np.array([2])])
    return FederatedData(ds, part, torch.device("cpu"))


def test_bn_parameters_and_statistics_stay_on_the_client_and_differ_per_client():
    data = two_pairs()
    algo = FedBN(make_ctx(data, factory=bn_mlp, batch_size=2))
    state = algo.init_state()
    lin = algo.eval_model.body[0]
    w0, b0 = lin.weight.detach().clone(), lin.bias.detach().clone()
    _, results, new, _ = one_round(algo, data)
    # the upload is the delta of the Linear layers only: 2*3+3 + 3*2+2 = 17 floats of 23
    total = sum(p.numel() for p in algo.eval_model.parameters())
    assert total == 23 and new.params.numel() == 17
    assert all(r.upload.vector.numel() == 17 for r in results)
    # each client's running statistics after its one step (momentum 0.1 from mean 0, var 1):
    # the BN input is the broadcast Linear layer's output on that client's 2 samples
    for cid in (0, 1):
        x, _ = data.train(cid)
        z = x @ w0.T + b0
        stored = algo.store.get(cid)
        bn_weight, bn_bias, mean, var, count = stored
        torch.testing.assert_close(mean, 0.1 * z.mean(0), rtol=0, atol=1e-6)
        torch.testing.assert_close(var, 0.9 + 0.1 * z.var(0, unbiased=True), rtol=0, atol=1e-6)
        assert int(count) == 1
        assert not torch.equal(bn_weight, torch.ones(3))  # trained locally
    assert not torch.equal(algo.store.get(0)[2], algo.store.get(1)[2])
    assert not torch.equal(algo.store.get(0)[0], algo.store.get(1)[0])
    # the personal model carries the client's own BN state; a never-sampled one the initial
    model = algo.personal_model(new, 1)
    bn = bn_layers(model)[0]
    assert torch.equal(bn.running_mean, algo.store.get(1)[2])
    assert torch.equal(bn.weight.detach(), algo.store.get(1)[0])
    initial = state.buffers["initial_bn"]
    assert torch.equal(initial[2], torch.zeros(3)) and torch.equal(initial[3], torch.ones(3))
    assert algo.global_model(new) is None and not algo.has_global_model


def test_the_next_round_starts_from_the_clients_own_bn_state():
    data = two_pairs()
    algo = FedBN(make_ctx(data, factory=bn_mlp, batch_size=2))
    _, _, new, _ = one_round(algo, data)
    module = algo.client_module(0)
    begin_one(algo, 0, algo.configure_round(new, RoundContext(2, (0,), 0))[0])
    assert torch.equal(bn_layers(module.model)[0].running_mean, algo.store.get(0)[2])


def test_without_bn_layers_fedbn_is_fedavg_bit_for_bit():
    data = two_pairs()
    _, _, avg, _ = one_round(FedAvg(make_ctx(data, factory=small_mlp, seed=3, batch_size=2)), data)
    algo = FedBN(make_ctx(data, factory=small_mlp, seed=3, batch_size=2))
    _, _, bn, _ = one_round(algo, data)
    assert torch.equal(avg.params, bn.params)
    assert algo.has_global_model and len(algo.store) == 0


def test_the_vectorized_executor_refuses_bn_running_statistics():
    algo = FedBN(make_ctx(two_pairs(), factory=bn_mlp, batch_size=2))
    with pytest.raises(ConfigError, match="executor: BatchNorm running statistics"):
        VectorizedExecutor(None, False, False, "cpu", "auto").check_algorithm(algo, 2)
    VectorizedExecutor(None, False, False, "cpu", "auto").check_algorithm(
        FedBN(make_ctx(two_pairs(), factory=small_mlp)), 2
    )


@pytest.mark.experiment
def test_cli_refuses_vectorized_fedbn_before_training(monkeypatch, capsys, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FEDEXP_CACHE_DIR", str(tmp_path / "cache"))
    args = ["algorithm=fedbn", "model=mlp_bn", "debug=smoke", "executor=vectorized"]
    code, err = main_in_process(monkeypatch, capsys, *args, f"hydra.run.dir={tmp_path}/run")
    assert code == 2
    assert err.strip().splitlines()[-1].startswith("fedexp: error: executor: BatchNorm")
    assert not (tmp_path / "run").exists()
