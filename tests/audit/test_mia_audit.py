"""The audit around a run: it reads and restores only the audited clients' store entries, leaves
torch's RNG as it found it, trains shadows and targets with the data's batch transform, reports
every metric, and its attack does not collapse to one score on an overfit non-iid client."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

import fedexp.audit.mia as mia
from fedexp.core.seeding import rng_devices
from fedexp.core.types import ConfigError, RoundContext
from fedexp.metrics.membership import METRICS
from fedexp.run import Experiment

REPO = Path(__file__).resolve().parents[2]


def experiment(tmp_path: Path, *overrides: str) -> Experiment:
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose(
            "config",
            overrides=["debug=smoke", f"paths.cache_dir={tmp_path / 'cache'}", *overrides],
        )
    (tmp_path / "run").mkdir(parents=True, exist_ok=True)
    return Experiment(cfg, tmp_path / "run")


@pytest.mark.experiment
def test_audit_restores_only_its_clients_the_rng_and_uses_the_batch_transform(
    tmp_path, monkeypatch
):
    torch.set_num_threads(1)
    exp = experiment(
        tmp_path,
        "algorithm=fedrep",  # per-client heads in the store: shadows would add entries
        "privacy=mia",
        "privacy.num_shadows=2",
        "privacy.attack_model=logistic",
        "client_store.max_bytes=1",  # every state but the newest spills to disk
    )
    algorithm, audit, store = exp.algorithm, exp.audits[0], exp.store
    state = algorithm.init_state()
    ctx = RoundContext(1, tuple(range(exp.data.num_clients)), exp.cfg.seed)
    exp.executor.run(algorithm, algorithm.configure_round(state, ctx), ctx, exp.data)
    before = store.state_dict()
    assert len(before) == 6 and store.num_spilled == 5

    def whole_store(*args):
        raise AssertionError("the audit read or rewrote the whole client store")

    monkeypatch.setattr(store, "state_dict", whole_store)
    monkeypatch.setattr(store, "load_state_dict", whole_store)
    transformed = []

    def transform(xb: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        transformed.append(len(xb))
        return xb

    dataset = dataclasses.replace(exp.data.dataset, batch_transform=transform)
    monkeypatch.setattr(exp.data, "dataset", dataset)
    rng_before = torch.get_rng_state()

    metrics = audit.on_evaluate(SimpleNamespace(algorithm=algorithm, rounds=1), state, 1)

    assert set(metrics) == set(METRICS)
    assert all(0.0 <= v <= 1.0 for v in metrics.values())
    assert torch.equal(torch.get_rng_state(), rng_before)
    assert transformed, "shadows and targets train with data.batch_transform"
    monkeypatch.undo()
    after = store.state_dict()
    assert sorted(after) == sorted(before)  # no shadow (ids 6 to 9) left behind
    for cid, value in before.items():
        assert torch.equal(after[cid], value)


@pytest.mark.experiment
def test_no_metric_where_the_algorithm_rebuilds_no_model(tmp_path, caplog):
    torch.set_num_threads(1)
    exp = experiment(
        tmp_path,
        "algorithm=fedhenn",
        "algorithm.variant=heterogeneous",
        "algorithm.upload=representations",  # no weights travel
        "privacy=mia",
        "privacy.num_shadows=1",
    )
    algorithm, audit = exp.algorithm, exp.audits[0]
    state = algorithm.init_state()
    with caplog.at_level("INFO", logger="fedexp.audit.mia"):
        metrics = audit.on_evaluate(SimpleNamespace(algorithm=algorithm, rounds=1), state, 1)
    assert metrics == {}
    assert "rebuilds no model" in caplog.text
    assert len(exp.store) == 0  # the target's local training left nothing behind


@pytest.mark.experiment
def test_heterogeneous_fedhenn_shadows_start_from_their_targets_model(tmp_path, monkeypatch):
    # upload=weights: the eavesdropper rebuilds the target's model from its upload; each shadow
    # has the target's architecture and starts from the weights the target last uploaded
    torch.set_num_threads(1)
    exp = experiment(
        tmp_path,
        "algorithm=fedhenn",
        "algorithm.variant=heterogeneous",
        "privacy=mia",
        "privacy.num_targets=2",
        "privacy.num_shadows=2",
        "privacy.attack_model=logistic",
        "seed=1",  # clients 0..5 have the architectures 2 0 0 4 1 0
    )
    algorithm, audit, store = exp.algorithm, exp.audits[0], exp.store
    state = algorithm.init_state()
    ctx = RoundContext(1, tuple(range(exp.data.num_clients)), exp.cfg.seed)
    results = exp.executor.run(algorithm, algorithm.configure_round(state, ctx), ctx, exp.data)
    state, _ = algorithm.aggregate(state, results, ctx)
    before = store.state_dict()
    started = {}
    begin = algorithm.begin

    def record(module, client_ids, payloads, stats):
        for cid in client_ids:
            started[cid] = (algorithm.arch_of(cid), algorithm.client_params(cid))
        return begin(module, client_ids, payloads, stats)

    monkeypatch.setattr(algorithm, "begin", record)
    metrics = audit.on_evaluate(SimpleNamespace(algorithm=algorithm, rounds=1), state, 1)
    assert set(metrics) == set(METRICS)
    targets = [c for c in started if c < 6]
    assert len(targets) == 2 and len(started) == 2 + 2 * 2
    for t, cid in enumerate(targets):
        for sid in audit.shadow_ids(t):
            arch, params = started[sid]
            assert arch == algorithm.archs[cid] and torch.equal(params, before[cid])
    assert sorted(store.state_dict()) == sorted(before)  # no shadow left behind


def test_the_forked_rng_is_the_training_devices():
    assert rng_devices(torch.device("cpu")) == []
    assert rng_devices(torch.device("cuda", 1)) == [1]  # what seed_global_rng reseeds


@pytest.mark.experiment
def test_the_attack_scores_vary_on_clients_that_overfit_a_non_iid_shard(tmp_path, monkeypatch):
    """Two-label shards, 30 local epochs on ~57 samples: targets far more confident than shadows
    trained on the pool's ten-label mix. Those shadows' tree ensemble scored every target sample
    alike (privacy/mia_acc exactly 0.5); shadows on the target's labels must not."""
    torch.set_num_threads(1)
    exp = experiment(
        tmp_path,
        "privacy=mia",
        "num_clients=20",
        "client.local_epochs=30",
        "partition.val_fraction=0",
    )
    assert exp.cfg.partition._target_.endswith(".Shards") and exp.cfg.privacy.attack_model == "gbdt"
    algorithm, audit = exp.algorithm, exp.audits[0]
    scored = []

    def spy(members, non_members):
        scored.append(np.concatenate([members, non_members]))
        return membership_metrics(members, non_members)

    membership_metrics = mia.membership_metrics
    monkeypatch.setattr(mia, "membership_metrics", spy)
    state = algorithm.init_state()
    metrics = audit.on_evaluate(SimpleNamespace(algorithm=algorithm, rounds=1), state, 1)
    assert len(scored) == 2  # both targets scored
    assert all(len(np.unique(s)) >= 5 for s in scored), [len(np.unique(s)) for s in scored]
    assert set(metrics) == set(METRICS)


@pytest.mark.experiment
def test_an_unknown_shadow_data_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="privacy.shadow_data: must be one of"):
        experiment(tmp_path, "privacy=mia", "privacy.shadow_data=public")
