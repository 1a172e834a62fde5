"""FedMD: the consensus is the mean of the clients' scores (by hand); the digest pulls a model's
logits towards the consensus on the round's public subset (one Adam step by hand); scores go up
on the next round's subset; digest_epochs=0 is algorithm=local exactly (one architecture and a
family); the ledger by hand; seeded; refusals."""

from __future__ import annotations

import json
from functools import partial

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf
from torch import nn

from components import with_yaml
from conftest import main_in_process
from fedexp.algorithms import fedmd
from fedexp.algorithms.fedmd import ClassScores, Consensus, FedMD
from fedexp.algorithms.local import Local
from fedexp.core.cohort import RoundResults
from fedexp.core.flat import flat_params
from fedexp.core.types import ClientResult, ConfigError, RoundContext
from fedexp.data.datasets import Dataset
from fedexp.data.federated import FederatedData
from fedexp.data.partition import Partition
from fedexp.models.family import mlp_family
from fedexp.models.mlp import BodyHead, mlp
from handworld import begin_one, make_ctx, one_round

FedMD = with_yaml(FedMD, "algorithm", "fedmd", public_size=4)


def pool_world(
    pool: int = 12, clients: int = 4, per_client: int = 10, dim: int = 3, classes: int = 3
):
    """`clients` clients of seeded Gaussian samples (8 of 10 train), a server pool of `pool`
    inputs no client holds."""
    g = torch.Generator().manual_seed(0)
    n = clients * per_client
    x, y = torch.randn(n, dim, generator=g), torch.randint(0, classes, (n,), generator=g)
    parts = np.array_split(np.arange(n), clients)
    cut = int(0.8 * per_client)
    dataset = Dataset("pool", x, y, x[:8], y[:8], classes, (dim,))
    dataset.server_x = torch.randn(pool, dim, generator=g)
    dataset.server_y = (dataset.server_x[:, 0] > 0).long()  # read only by pretrain_epochs
    partition = Partition([p[:cut] for p in parts], [p[cut:] for p in parts])
    return FederatedData(dataset, partition, torch.device("cpu"))


SMALL = partial(mlp, input_shape=(3,), num_classes=3, hidden=(5,))
FAMILY = partial(mlp_family, input_shape=(3,), num_classes=3, num_archs=3, hidden=(6, 6))


def run(algo, rounds, cohorts=((0, 1, 2), (1, 3), (0, 2, 3))):
    state = algo.init_state()
    for t in range(1, rounds + 1):
        _, _, state, _ = one_round(
            algo, ids=cohorts[(t - 1) % len(cohorts)], round_idx=t, state=state
        )
    return state


def test_the_consensus_is_the_mean_of_two_clients_scores_by_hand():
    algo = FedMD(make_ctx(pool_world(), factory=SMALL), public_size=3)
    a = torch.tensor([[1.0, 2.0, 0.0], [3.0, 4.0, 1.0], [5.0, 6.0, -1.0]])
    b = torch.tensor([[3.0, 0.0, 2.0], [1.0, 1.0, 1.0], [0.0, 2.0, 1.0]])
    results = RoundResults.of(
        [ClientResult(0, 9, ClassScores(a), 0.0, 1), ClientResult(2, 1, ClassScores(b), 0.0, 1)]
    )
    state, metrics = algo.aggregate(algo.init_state(), results, RoundContext(4, (0, 2), 0))
    expected = torch.tensor([[2.0, 1.0, 1.0], [2.0, 2.5, 1.0], [2.5, 4.0, 0.0]])  # unweighted
    assert torch.equal(state.buffers["consensus"], expected)
    assert state.buffers["consensus_round"] == 5  # it scores P_5: round 5 digests it
    # |a - mean| and |b - mean| are equal entrywise: (1+1+1 + 1+1.5+0 + 2.5+2+1) / 9
    assert metrics["fedmd/score_spread"] == pytest.approx(11.0 / 9)
    sent = algo.configure_round(state, RoundContext(5, (1, 3), 0))
    assert torch.equal(sent[1].scores, expected) and sent[3] is sent[1]
    stale = algo.configure_round(state, RoundContext(6, (1,), 0))[1]  # P_5's consensus is not P_6's
    assert stale.scores is None and stale.num_bits() == 0


def zero_model(input_shape=(3,), num_classes=3):
    head = nn.Linear(3, 3)
    nn.init.zeros_(head.weight)
    nn.init.zeros_(head.bias)
    return BodyHead(nn.Flatten(), head)


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_one_digest_step_moves_every_logit_towards_the_consensus_by_adams_lr(sign):
    # a zero model scores 0 everywhere; under L1 every bias gradient is -sign/(L C) and Adam's
    # first step is lr * g / (|g| + eps): each bias moves by sign * lr (one batch, one epoch)
    algo = FedMD(make_ctx(pool_world(), factory=zero_model), digest_batch_size=64, digest_lr=0.01)
    algo.init_state()
    consensus = sign * torch.rand(4, 3) + sign  # every entry has the sign `sign`
    module = begin_one(algo, 1, Consensus(consensus, 2))
    torch.testing.assert_close(
        module.model.head.bias, torch.full((3,), 0.01 * sign), rtol=0, atol=1e-6
    )
    assert algo.store.get(1) is None  # begin is a value: nothing stored until `end`
    # the stored (initial) model stays, and `begin` without a consensus digests nothing
    module = begin_one(algo, 1, Consensus(None, 1))
    assert torch.equal(module.model.head.bias, torch.zeros(3))


def test_scores_go_up_on_the_next_rounds_public_subset_from_the_trained_model():
    data = pool_world()
    algo = FedMD(make_ctx(data, factory=SMALL))
    _, results, state, _ = one_round(algo, ids=(0, 2), round_idx=3)
    p3, p4 = algo.public(3), algo.public(4)
    pool_rows = {tuple(r.tolist()) for r in data.server_x}
    assert len(p4) == 4 and all(tuple(r.tolist()) in pool_rows for r in p4)  # from the pool
    assert not torch.equal(p3, p4)  # re-drawn every round
    for r in results:
        model = algo.personal_model(state, r.client_id)  # the stored, trained model
        model.eval()
        with torch.no_grad():
            torch.testing.assert_close(r.upload.scores, model(p4), rtol=0, atol=1e-6)


@pytest.mark.parametrize("factory", [SMALL, FAMILY], ids=["one_architecture", "family"])
def test_digest_epochs_zero_is_local_training_exactly(factory):
    data = pool_world()
    fedmd = FedMD(make_ctx(data, factory=factory, local_epochs=2, batch_size=3), digest_epochs=0)
    local = Local(make_ctx(data, factory=factory, local_epochs=2, batch_size=3))
    state_md, state_local = run(fedmd, 4), run(local, 4)
    assert state_md.buffers["consensus_round"] == 5  # scores did travel
    for cid in range(4):
        assert torch.equal(fedmd.store.get(cid), local.store.get(cid)), cid
        x = data.x[:5]
        assert torch.equal(
            fedmd.personal_model(state_md, cid)(x), local.personal_model(state_local, cid)(x)
        )
    assert fedmd.run_warnings(4) and "digest_epochs=0" in fedmd.run_warnings(4)[0]


def test_digesting_changes_the_models_and_the_run_is_seeded():
    data = pool_world()
    runs = [FedMD(make_ctx(data, factory=FAMILY, batch_size=3)) for _ in range(2)]
    local = Local(make_ctx(data, factory=FAMILY, batch_size=3))
    states = [run(a, 3) for a in runs] + [run(local, 3)]
    for cid in range(4):
        assert torch.equal(runs[0].store.get(cid), runs[1].store.get(cid))
    assert torch.equal(states[0].buffers["consensus"], states[1].buffers["consensus"])
    # clients 1 (rounds 2, 3... digests in round 2) differ from local training
    assert not torch.equal(runs[0].store.get(1), local.store.get(1))
    assert len({a for a in map(runs[0].arch_of, range(4))}) > 1  # several architectures


@torch.no_grad()
def pool_loss(algo, row) -> float:
    model = algo.model_of(0, row)
    return float(F.cross_entropy(model(algo.ctx.data.server_x), algo.ctx.data.server_y))


def test_pretraining_trains_each_initial_model_on_the_labelled_pool_once():
    data = pool_world()
    plain = FedMD(make_ctx(data, factory=SMALL))
    algo = FedMD(make_ctx(data, factory=SMALL), pretrain_epochs=20)
    plain.init_state(), algo.init_state()
    row = algo.initial_row(0)
    assert pool_loss(algo, row) < pool_loss(plain, plain.initial_row(0))
    assert torch.equal(algo.initial_row(3), row)  # one architecture: one initial model for all
    module = begin_one(algo, 1, Consensus(None, 1))  # a client's first round starts from it
    assert torch.equal(flat_params(list(module.model.parameters())), row)
    assert "server pool's labels" in algo.run_warnings(3)[0]
    family = FedMD(make_ctx(data, factory=FAMILY), pretrain_epochs=1)
    family.init_state()
    assert family.initial_row(0) is family.initial_row(0)  # computed once, each client its own
    data.server_y = None
    with pytest.raises(ConfigError, match="algorithm.pretrain_epochs: the server pool holds no"):
        FedMD(make_ctx(data, factory=SMALL), pretrain_epochs=1)


def test_the_ledger_by_hand():
    # public_size 4, 3 classes: 4 * 3 floats of 32 bits each way; nothing down in round 1
    algo = FedMD(make_ctx(pool_world(), factory=SMALL))
    payloads, results, state, _ = one_round(algo, ids=(0, 1), round_idx=1)
    assert [p.num_bits() for p in payloads.values()] == [0, 0]
    assert results.upload_bits(lambda s: 0) == 2 * 4 * 3 * 32
    payloads = algo.configure_round(state, RoundContext(2, (0, 1, 3), 0))
    assert sum(p.num_bits() for p in payloads.values()) == 3 * 4 * 3 * 32


def test_bad_options_and_a_missing_pool_are_config_errors():
    with pytest.raises(ConfigError, match="partition.server_pool: 0, but FedMD draws"):
        FedMD(make_ctx(pool_world(pool=0), factory=SMALL))
    with pytest.raises(ConfigError, match="partition.server_pool: 12 < 13"):
        FedMD(make_ctx(pool_world(), factory=SMALL), public_size=13)
    for key, value in [
        ("digest_epochs", -1),
        ("digest_batch_size", 0),
        ("digest_lr", 0.0),
        ("digest_loss", "kl"),
        ("public_size", 0),
        ("pretrain_epochs", -1),
    ]:
        with pytest.raises(ConfigError, match=f"algorithm.{key}"):
            FedMD(make_ctx(pool_world(), factory=SMALL), **{key: value})
    cfg = OmegaConf.create({"algorithm": {"public_size": 5000}, "partition": {"server_pool": 0}})
    with pytest.raises(ConfigError, match="set partition.server_pool >= 5000"):
        fedmd.FedMD.check_config(cfg)  # before any data is loaded
    assert fedmd.FedMD.server_pool_need(cfg) == 10000  # auto: two subsets' worth


@pytest.mark.slow
@pytest.mark.parametrize("model", ["mlp_family", "cnn_family"])
def test_the_cli_runs_heterogeneous_clients_on_digits(model, monkeypatch, capsys, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FEDEXP_CACHE_DIR", str(tmp_path / "cache"))
    run_dir = tmp_path / "run"
    args = ["debug=smoke", "algorithm=fedmd", f"model={model}", f"hydra.run.dir={run_dir}"]
    code, err = main_in_process(monkeypatch, capsys, *args, "partition.server_pool=16")
    assert code == 0, err
    summary = json.loads((run_dir / "summary.json").read_text())
    assert 0.0 <= summary["metrics"]["eval/personal/acc_mean"] <= 1.0
    assert summary["metrics"]["comm/down_bits_total"] == 3 * 8 * 10 * 32  # round 2: 3 clients
    assert sum(1 for k in summary["describe"] if k.endswith("_clients")) == 5


@pytest.mark.slow
def test_local_on_a_family_trains_fedhenns_heterogeneous_clients_at_eta0(
    monkeypatch, capsys, tmp_path
):
    # the isolated-training reference of docs/heterogeneous.md: the same clients' models
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FEDEXP_CACHE_DIR", str(tmp_path / "cache"))
    shared = ["debug=smoke", "model=mlp_family", "partition.server_pool=16", "client=fedhenn"]
    runs = {
        "henn": ["algorithm=fedhenn", "algorithm.variant=heterogeneous", "algorithm.eta0=0"],
        "local": ["algorithm=local"],
    }
    metrics = {}
    for name, args in runs.items():
        run_dir = tmp_path / name
        code, err = main_in_process(monkeypatch, capsys, *shared, *args, f"hydra.run.dir={run_dir}")
        assert code == 0, err
        metrics[name] = json.loads((run_dir / "summary.json").read_text())["metrics"]
    personal = [
        k for k in metrics["local"] if k.startswith(("eval/personal/", "eval/val/personal/"))
    ]
    assert personal and all(metrics["henn"][k] == metrics["local"][k] for k in personal)
