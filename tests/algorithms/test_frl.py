"""FRL: seeded reconstruction, the ranking round trip, the vote, a round through the executor."""

from __future__ import annotations

from functools import partial

import torch

from components import with_yaml
from fedexp.aggregators.mean import weighted_mean
from fedexp.aggregators.rank_vote import rank_vote
from fedexp.algorithms.frl import FRL
from fedexp.algorithms.supermask_fedavg import SupermaskFedAvg
from fedexp.core.algorithm import BuildContext
from fedexp.core.client_store import ClientStore
from fedexp.core.cohort import RoundResults
from fedexp.core.local import ClientConfig
from fedexp.core.types import ClientResult, Ranking, RoundContext
from fedexp.engine.executors.sequential import SequentialExecutor
from fedexp.models.mlp import mlp
from fedexp.models.supermask import edge_mask, num_kept, supermask_layers
from handworld import one_client

FRL = with_yaml(FRL, "algorithm", "frl")

CLIENT = ClientConfig(
    **{
        "local_epochs": 2,
        "batch_size": 4,
        "optimizer": "sgd",
        "lr": 0.4,
        "momentum": 0.9,
        "weight_decay": 0.0,
    }
)


def make_frl(seed: int = 0, **kwargs) -> FRL:
    ctx = BuildContext(
        model_factory=partial(mlp, input_shape=(4,), num_classes=3, hidden=(6,)),
        client=CLIENT,
        aggregator=partial(rank_vote),
        data=None,
        device=torch.device("cpu"),
        seed=seed,
        store=ClientStore(),
    )
    return FRL(ctx, **kwargs)


def test_seeded_reconstruction_is_identical_on_server_and_clients():
    server, elsewhere = make_frl(), make_frl()  # a second process rebuilding from the seed
    state = server.init_state()
    assert state.params is None and isinstance(state.buffers["model_seed"], int)
    for model in (server.module.model, elsewhere.module.model, elsewhere.eval_model):
        for a, b in zip(supermask_layers(server.eval_model), supermask_layers(model)):
            assert torch.equal(a.weight, b.weight) and torch.equal(a.scores, b.scores)
    for s0, client_s0 in zip(state.buffers["initial_sorted_scores"], elsewhere.client_s0):
        assert torch.equal(s0, client_s0)
    other = make_frl(seed=1).eval_model
    assert not torch.equal(
        supermask_layers(other)[0].weight, supermask_layers(server.eval_model)[0].weight
    )


def test_untrained_client_uploads_the_global_ranking():
    for key in ("abs", "signed"):
        frl = make_frl(rank_key=key)
        state = frl.init_state()
        state.buffers["global_ranking"] = [
            torch.randperm(r.numel()) for r in state.buffers["global_ranking"]
        ]
        payload = frl.configure_round(state, RoundContext(1, (0, 1), 0))[0]
        upload = one_client(frl, 0, payload)
        assert all(torch.equal(u, g) for u, g in zip(upload.layers, payload.layers))


def test_global_mask_is_the_top_k_of_the_global_ranking():
    frl = make_frl(k=0.25)
    state = frl.init_state()
    state.buffers["global_ranking"] = [
        torch.randperm(r.numel()) for r in state.buffers["global_ranking"]
    ]
    model = frl.global_model(state)
    for layer, edge_ranking in zip(supermask_layers(model), state.buffers["global_ranking"]):
        kept = edge_mask(layer.scores, layer.k).reshape(-1).nonzero().flatten()
        top = edge_ranking[-kept.numel() :]
        assert set(kept.tolist()) == set(top.tolist())
        assert kept.numel() == layer.weight.numel() - int(0.75 * layer.weight.numel())


def test_vote_of_identical_rankings_keeps_them():
    frl = make_frl()
    state = frl.init_state()
    target = [torch.randperm(r.numel()) for r in state.buffers["global_ranking"]]
    uploads = [ClientResult(c, 10, Ranking(tuple(target)), 0.0, 1) for c in range(3)]
    results = RoundResults.of(uploads)
    new_state, metrics = frl.aggregate(state, results, RoundContext(1, (0, 1, 2), 0))
    assert all(torch.equal(a, b) for a, b in zip(new_state.buffers["global_ranking"], target))
    assert metrics["frl/mask_change"] > 0.0  # a random ranking moves some kept edges
    _, again = frl.aggregate(new_state, results, RoundContext(2, (0, 1, 2), 0))
    assert again["frl/mask_change"] == 0.0  # the same vote again changes nothing


class TinyData:
    batch_transform = None

    def __init__(self):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(16, 4, generator=g)
        self.y = (self.x[:, 0] > 0).long() + (self.x[:, 1] > 0).long()

    def train(self, client_id):
        half = slice(0, 8) if client_id == 0 else slice(8, 16)
        return self.x[half], self.y[half]


def test_a_round_through_the_executor_changes_only_the_ranking():
    frl = make_frl()
    state = frl.init_state()
    weights_before = [m.weight.clone() for m in supermask_layers(frl.module.model)]
    ctx = RoundContext(1, (0, 1), 0)
    results = SequentialExecutor().run(frl, frl.configure_round(state, ctx), ctx, TinyData())
    assert all(isinstance(r.upload, Ranking) for r in results)
    new_state, _ = frl.aggregate(state, results, ctx)
    for old, new in zip(state.buffers["global_ranking"], new_state.buffers["global_ranking"]):
        assert torch.equal(torch.sort(new).values, torch.arange(old.numel()))  # a permutation
    assert any(
        not torch.equal(a, b)
        for a, b in zip(state.buffers["global_ranking"], new_state.buffers["global_ranking"])
    )
    for before, layer in zip(weights_before, supermask_layers(frl.module.model)):
        assert torch.equal(before, layer.weight)


def test_eavesdropper_rebuilds_the_clients_own_network_from_seed_and_ranking():
    frl = make_frl()
    state = frl.init_state()
    ctx = RoundContext(1, (0,), 0)
    payloads = frl.configure_round(state, ctx)
    (result,) = SequentialExecutor().run(frl, payloads, ctx, TinyData())
    x = torch.randn(5, 4, generator=torch.Generator().manual_seed(3))
    client_out = frl.module.model(x)  # the client's trained scores, masked
    rebuilt = make_frl().eavesdropped_model(payloads[0], result.upload)  # from the seed alone
    assert torch.equal(rebuilt(x), client_out)
    assert not torch.equal(frl.global_model(state)(x), client_out)  # training moved the mask


# ---- supermask_fedavg: FedAvg over FRL's scores, the rank vote's ablation ---------------------
SupermaskFedAvg = with_yaml(SupermaskFedAvg, "algorithm", "supermask_fedavg")


def make_smf(seed: int = 0) -> SupermaskFedAvg:
    ctx = BuildContext(
        model_factory=partial(mlp, input_shape=(4,), num_classes=3, hidden=(6,)),
        client=CLIENT,
        aggregator=partial(weighted_mean),
        data=None,
        device=torch.device("cpu"),
        seed=seed,
        store=ClientStore(),
    )
    return SupermaskFedAvg(ctx)


def test_supermask_fedavg_trains_frls_network_as_frl_and_averages_the_scores():
    frl, smf = make_frl(), make_smf()
    frl_state, smf_state = frl.init_state(), smf.init_state()
    # the same seeded network: frozen weights and initial scores, in every copy
    for model in (smf.module.model, smf.eval_model):
        for a, b in zip(supermask_layers(frl.eval_model), supermask_layers(model)):
            assert torch.equal(a.weight, b.weight) and torch.equal(a.scores, b.scores)
    ctx = RoundContext(1, (0, 1), 0)
    frl_results = SequentialExecutor().run(
        frl, frl.configure_round(frl_state, ctx), ctx, TinyData()
    )
    smf_results = SequentialExecutor().run(
        smf, smf.configure_round(smf_state, ctx), ctx, TinyData()
    )
    # identical client training: FRL's upload is the ranking of the very scores FedAvg's client
    # uploads (as a delta from the global scores)
    sizes = [m.weight.numel() for m in supermask_layers(smf.eval_model)]
    trained = []
    for f, s in zip(frl_results, smf_results):
        scores = (smf_state.params + s.upload.vector).split(sizes)
        trained.append(scores)
        for rank, score in zip(f.upload.layers, scores):
            assert torch.equal(rank, torch.argsort(score.abs(), stable=True))
    # the server: the plain mean of the two clients' scores (uniform weighting)
    new_state, _ = smf.aggregate(smf_state, smf_results, ctx)
    expected = torch.cat([(a + b) / 2 for a, b in zip(*trained)])
    torch.testing.assert_close(new_state.params, expected, rtol=0, atol=1e-6)
    model = smf.global_model(new_state)
    for layer, score in zip(supermask_layers(model), new_state.params.split(sizes)):
        assert torch.equal(layer.scores.detach().reshape(-1), score)
        assert int(edge_mask(layer.scores, layer.k).sum()) == num_kept(score.numel(), layer.k)
