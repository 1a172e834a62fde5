import numpy as np
import torch

from components import with_yaml
from fedexp.algorithms.centralised import Centralised
from fedexp.algorithms.fedavg import FedAvg
from fedexp.data.datasets import Dataset
from fedexp.data.federated import FederatedData
from fedexp.data.partition import Partition
from handworld import make_ctx, one_round, small_mlp

FedAvg = with_yaml(FedAvg, "algorithm", "fedavg")


def three_clients(sizes=(3, 5, 2)):
    """Clients of unequal sizes over a 2-feature, 2-class task."""
    n = sum(sizes)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(n, 2, generator=g)
    y = (x[:, 1] > 0).long()
    ds = Dataset("hand", x, y, x.clone(), y.clone(), 2, (2,))
    cuts = np.cumsum([0, *sizes])
    shards = [np.arange(a, b) for a, b in zip(cuts[:-1], cuts[1:])]
    return FederatedData(ds, Partition(shards, shards), torch.device("cpu"))


def test_samples_seen_per_round_equal_fedavgs_round_budget():
    data = three_clients()
    cfg = dict(factory=small_mlp, batch_size=2, local_epochs=3)
    central = Centralised(make_ctx(data, **cfg))
    seen = []  # every sample the server's training steps see
    step = central.module.training_step
    central.module.training_step = lambda batch, i: seen.append(len(batch[1])) or step(batch, i)
    payloads, results, _, metrics = one_round(central, data, (0, 2))
    _, fed_results, _, _ = one_round(FedAvg(make_ctx(data, **cfg)), data, (0, 2))
    budget = sum(r.num_samples for r in fed_results) * 3  # (3 + 2) samples x 3 epochs = 15
    assert budget == 15 == sum(seen) == metrics["server/samples_seen"]
    assert seen == [2, 2, 1] * 3  # one pooled stream of 5: one short batch per epoch
    assert metrics["server/steps"] == 9  # FedAvg takes (2 + 1) * 3 = 9 too, in other batches
    assert all(r.num_steps == 0 for r in results)  # clients train nothing
    assert sum(p.num_bits() for p in payloads.values()) == 0
    assert sum(r.upload.num_bits() for r in results) == 0


def test_one_full_batch_step_on_the_pooled_data_by_hand(two_clients):
    # zero weights, both samples in one batch (x=[1,2], y=0 and x=[2,0], y=1), lr 0.1:
    # grad W = mean_i (p_i - onehot(y_i)) x_i^T = ([[-.5,-1],[.5,1]] + [[1,0],[-1,0]]) / 2
    # = [[.25,-.5],[-.25,.5]]; grad b = ([-.5,.5] + [.5,-.5]) / 2 = 0
    algo = Centralised(make_ctx(two_clients, batch_size=2))
    _, _, new, metrics = one_round(algo, two_clients, (0, 1))
    expected_w = torch.tensor([[-0.025, 0.05], [0.025, -0.05]])
    torch.testing.assert_close(new.params[:4], expected_w.reshape(-1), rtol=0, atol=1e-7)
    torch.testing.assert_close(new.params[4:], torch.zeros(2), rtol=0, atol=1e-7)
    assert metrics["train/loss"] == torch.log(torch.tensor(2.0)).item()
    model = algo.global_model(new)
    assert torch.equal(torch.cat([p.reshape(-1) for p in model.parameters()]), new.params)
    assert algo.personal_model(new, 0) is None
