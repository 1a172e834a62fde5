"""The audit around a run: it reads and restores only the audited clients' store entries, leaves
torch's RNG as it found it, and trains shadows and targets with the data's batch transform."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace

import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from fedexp.core.types import RoundContext
from fedexp.metrics.mia import rng_devices
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
    algorithm, audit, store = exp.algorithm, exp.callbacks[0], exp.store
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

    assert 0.0 <= metrics["privacy/mia_acc"] <= 1.0
    assert torch.equal(torch.get_rng_state(), rng_before)
    assert transformed, "shadows and targets train with data.batch_transform"
    monkeypatch.undo()
    after = store.state_dict()
    assert sorted(after) == sorted(before)  # no shadow (ids 6, 7) left behind
    for cid, value in before.items():
        assert torch.equal(after[cid], value)


def test_no_metric_where_the_algorithm_rebuilds_no_model(tmp_path, caplog):
    torch.set_num_threads(1)
    exp = experiment(
        tmp_path,
        "algorithm=fedhenn",
        "algorithm.variant=heterogeneous",
        "privacy=mia",
        "privacy.num_shadows=1",
    )
    algorithm, audit = exp.algorithm, exp.callbacks[0]
    state = algorithm.init_state()
    with caplog.at_level("INFO", logger="fedexp.metrics.mia"):
        metrics = audit.on_evaluate(SimpleNamespace(algorithm=algorithm, rounds=1), state, 1)
    assert metrics == {}
    assert "rebuilds no model" in caplog.text
    assert len(exp.store) == 0  # the target's local training left nothing behind


def test_the_forked_rng_is_the_training_devices():
    assert rng_devices(torch.device("cpu")) == []
    assert rng_devices(torch.device("cuda", 1)) == [1]  # what seed_global_rng reseeds
