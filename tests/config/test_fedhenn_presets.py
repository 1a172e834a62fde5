"""The FedHeNN presets compose and say what the paper's settings are."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

REPO = Path(__file__).resolve().parents[2]
PRESETS = sorted(p.stem for p in (REPO / "conf" / "experiment").glob("fedhenn_*.yaml"))


def test_the_paper_settings_have_presets():
    assert {
        "fedhenn_cifar10_homogeneous",
        "fedhenn_cifar10_heterogeneous",
        "fedhenn_cifar100_homogeneous",
        "fedhenn_cifar100_heterogeneous",
        "fedhenn_cifar10_scalability500",
        "fedhenn_cifar10_data_reduction",
        "fedhenn_cifar10_rbf",
        "fedhenn_cifar10_procrustes",
        "fedhenn_sent140_homogeneous",
        "fedhenn_sent140_heterogeneous",
    } <= set(PRESETS)


@pytest.mark.parametrize("preset", PRESETS)
def test_preset_composes(preset):
    dataset = next(d for d in ("cifar100", "sent140", "cifar10") if d in preset)
    if not (REPO / "conf" / "dataset" / f"{dataset}.yaml").exists():
        pytest.skip(f"dataset={dataset} is not on this branch")
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=[f"experiment={preset}"])
    algorithm = cfg.algorithm
    assert algorithm._target_ == "fedexp.algorithms.fedhenn.fedhenn"
    assert algorithm.rad_size == 5000 and cfg.client.local_epochs == 20
    # the RAD is re-drawn each round from a server pool twice its size, which no client holds
    assert algorithm.rad_source == "server" and cfg.partition.server_pool == 10000
    assert cfg.rounds == 200 and cfg.clients_per_round == cfg.num_clients // 10
    if dataset != "sent140":
        assert cfg.partition.classes_per_client == 5
    # one model for every method; heterogeneous FedHeNN draws each client's from its family
    assert not cfg.model._target_.endswith("_family")
    if algorithm.variant == "heterogeneous":
        assert algorithm.default_family == ("lstm_family" if dataset == "sent140" else "cnn_family")
    if algorithm.distance == "procrustes":
        assert algorithm.variant == "homogeneous"


def test_smoke_shrinks_the_rad_of_every_fedhenn_preset_and_only_fedhenn_and_every_pool():
    for preset in PRESETS:
        with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
            cfg = compose("config", overrides=[f"experiment={preset}", "debug=smoke"])
            avg = compose(
                "config", overrides=[f"experiment={preset}", "debug=smoke", "algorithm=fedavg"]
            )
        assert cfg.algorithm.rad_size == 8 and cfg.algorithm.rad_source == "server", preset
        assert "rad_size" not in avg.algorithm, preset
        # the pool shrinks for every method alike: tiny test datasets can spare it
        from fedexp.config.pool import resolve_server_pool

        for c in (cfg, avg):
            resolve_server_pool(c)
            assert "max_server_pool" not in c.partition, preset
        assert cfg.partition.server_pool == avg.partition.server_pool == 16, preset
