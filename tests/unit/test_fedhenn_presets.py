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
    } <= set(PRESETS)


@pytest.mark.parametrize("preset", PRESETS)
def test_preset_composes(preset):
    dataset = "cifar100" if "cifar100" in preset else "cifar10"
    if not (REPO / "conf" / "dataset" / f"{dataset}.yaml").exists():
        pytest.skip(f"dataset={dataset} is not on this branch")
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=[f"experiment={preset}"])
    algorithm = cfg.algorithm
    assert algorithm._target_ == "fedexp.algorithms.fedhenn.fedhenn"
    assert algorithm.rad_size == 5000 and algorithm.server_pool >= algorithm.rad_size
    assert cfg.partition.classes_per_client == 5 and cfg.client.local_epochs == 20
    assert cfg.rounds == 200 and cfg.clients_per_round == cfg.num_clients // 10
    family = cfg.model._target_.endswith("cnn_family")
    assert family == (algorithm.variant == "heterogeneous")
    if algorithm.distance == "procrustes":
        assert algorithm.variant == "homogeneous"
