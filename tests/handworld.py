"""A two-client world small enough to compute by hand."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from fedexp.aggregators.mean import weighted_mean
from fedexp.core.algorithm import BuildContext
from fedexp.core.client_loop import load_start, module_rows, training_facts
from fedexp.core.client_store import ClientStore
from fedexp.core.cohort import unstack
from fedexp.core.local import ClientConfig, LocalTraining
from fedexp.core.types import RoundContext
from fedexp.data.datasets import Dataset
from fedexp.data.federated import FederatedData
from fedexp.data.partition import Partition
from fedexp.engine.executors.sequential import SequentialExecutor
from fedexp.models.mlp import BodyHead


def zero_linear(input_shape=(2,), num_classes=2):
    """A 2-in, 2-out linear classifier starting at zero (softmax = 1/2 everywhere)."""
    model = BodyHead(nn.Flatten(), nn.Linear(2, num_classes))
    nn.init.zeros_(model.head.weight)
    nn.init.zeros_(model.head.bias)
    return model


def small_mlp(input_shape=(2,), num_classes=2):
    return BodyHead(nn.Sequential(nn.Flatten(), nn.Linear(2, 4), nn.Tanh()), nn.Linear(4, 2))


def bn_mlp(input_shape=(2,), num_classes=2):
    """2 -> 3 (BatchNorm, ReLU) -> 2: 23 parameters, 3 + 3 + 1 running statistics."""
    body = nn.Sequential(nn.Linear(2, 3), nn.BatchNorm1d(3), nn.ReLU())
    return BodyHead(body, nn.Linear(3, 2))


# what `end` is told when a test calls it without local training
UNTRAINED = LocalTraining(steps=0, samples=0, mean_loss=torch.zeros(()))


def begin_one(algorithm, client_id, payload, stats=None):
    """`algorithm.begin` for a cohort of one, loaded into the client's module (as the
    sequential executor does before training); returns the module."""
    module = algorithm.client_module(client_id)
    load_start(module, algorithm.begin(module, [client_id], [payload], stats))
    return module


def end_one(algorithm, module, client_id, payload, training=UNTRAINED, data=None):
    """`algorithm.end` for a cohort of one, from the module as it stands; the client's upload
    (unstacked). `training`: a `LocalTraining` (none taken by default); `data`: the client's
    training (x, y) that `end` is told of (its local data by default)."""
    if data is None:
        data = (
            module.local_data if module.local_data is not None else (torch.zeros(0), torch.zeros(0))
        )
    facts = training_facts(client_id, training, *data)
    return unstack(algorithm.end(module, [payload], module_rows(module), facts), 0)


def one_client(algorithm, client_id, payload, training=UNTRAINED, stats=None):
    """`begin_one` then `end_one` without training: the client's upload."""
    module = begin_one(algorithm, client_id, payload, stats)
    return end_one(algorithm, module, client_id, payload, training)


def client_cfg(**kw):
    base = dict(
        local_epochs=1, batch_size=1, optimizer="sgd", lr=0.1, momentum=0.0, weight_decay=0.0
    )
    return ClientConfig(**{**base, **kw})


def two_client_data():
    """Client 0 holds x=[1,2], y=0; client 1 holds x=[2,0], y=1 (one sample each)."""
    x = torch.tensor([[1.0, 2.0], [2.0, 0.0]])
    y = torch.tensor([0, 1])
    ds = Dataset("hand", x, y, x.clone(), y.clone(), 2, (2,))
    part = Partition([np.array([0]), np.array([1])], [np.array([0]), np.array([1])])
    return FederatedData(ds, part, torch.device("cpu"))


def one_client_data(n=5):
    """One client with `n` samples of a 2-feature, 2-class task (batches of 2: a short one)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 2, generator=g)
    y = (x[:, 0] > 0).long()
    ds = Dataset("hand", x, y, x.clone(), y.clone(), 2, (2,))
    return FederatedData(ds, Partition([np.arange(n)], [np.arange(n)]), torch.device("cpu"))


def tiny_federation(num_clients: int = 3, per_client: int = 30, dim: int = 6, classes: int = 3):
    """`num_clients` clients of `per_client` seeded Gaussian samples (80% train, 20% test) of a
    `dim`-feature, `classes`-class task; a 20-sample global test set."""
    g = torch.Generator().manual_seed(0)
    n = num_clients * per_client
    x, y = torch.randn(n, dim, generator=g), torch.randint(0, classes, (n,), generator=g)
    parts = np.array_split(np.arange(n), num_clients)
    cut = int(0.8 * per_client)
    partition = Partition([p[:cut] for p in parts], [p[cut:] for p in parts])
    dataset = Dataset("tiny", x, y, x[:20], y[:20], classes, (dim,))
    return FederatedData(dataset, partition, torch.device("cpu"))


def make_ctx(data, factory=zero_linear, seed=0, client=None, **client_kw) -> BuildContext:
    """The BuildContext of a test world: `client` a ClientConfig, or client_cfg(**client_kw)."""
    return BuildContext(
        model_factory=factory,
        client=client if client is not None else client_cfg(**client_kw),
        aggregator=weighted_mean,
        data=data,
        device=torch.device("cpu"),
        seed=seed,
        store=ClientStore(),
    )


def mlp_ctx(aggregator=weighted_mean, data=None) -> BuildContext:
    """A 4-in, 3-class MLP (hidden 5) with SGD lr 0.1, batch 4, one local epoch."""
    from functools import partial

    from fedexp.models.mlp import mlp

    return BuildContext(
        model_factory=partial(mlp, input_shape=(4,), num_classes=3, hidden=(5,)),
        client=client_cfg(batch_size=4),
        aggregator=partial(aggregator),
        data=data,
        device=torch.device("cpu"),
        seed=0,
        store=ClientStore(),
    )


def one_round(
    algo, data=None, ids=(0, 1), executor=None, round_idx=1, seed=0, state=None, aggregate=True
):
    """One round as the round loop runs it: configure, train `ids` on `executor` (sequential by
    default), aggregate. `data` defaults to the algorithm's, `state` to `algo.init_state()`.
    Returns (payloads, results, new_state, metrics); the last two are None without `aggregate`."""
    state = algo.init_state() if state is None else state
    data = algo.ctx.data if data is None else data
    ctx = RoundContext(round_idx, tuple(ids), seed)
    stats = algo.broadcast_stats(state)  # beside the payloads, as the round loop sends them
    payloads = algo.configure_round(state, ctx)
    results = (executor or SequentialExecutor()).run(algo, payloads, ctx, data, stats)
    if not aggregate:
        return payloads, results, None, None
    new_state, metrics = algo.aggregate(state, results, ctx)
    return payloads, results, new_state, metrics
