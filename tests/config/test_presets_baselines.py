"""Every preset composes with each of its paper's baselines in one shared setting, and each
algorithm selected alone brings its paper's local training, which the command line still beats.

Composition only (Hydra's compose API in this process); tests/config/test_preset_baselines_run.py
runs them on tiny datasets written in the real on-disk formats.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf, open_dict

REPO = Path(__file__).resolve().parents[2]
CONF = REPO / "conf"
PRESETS = sorted(p.stem for p in (CONF / "experiment").glob("*.yaml"))

# a baseline: (algorithm, aggregator or None for the algorithm's own)
PAPER_BASELINES = {
    "fedhenn": [("fedhenn", None), ("fedavg", None), ("fedprox", None), ("fedrep", None)],
    "waffle": [("waffle", None), ("fedavg", None), ("fedprox", None)],
    "frl": [
        ("frl", None),
        ("fedavg", None),
        ("fedavg", "trimmed_mean"),
        ("fedavg", "multikrum"),
        ("signsgd", None),
        ("topk", None),
    ],
}
# one row of FRL's Table 1 with its robust aggregator pinned: FedAvg with that aggregator only
PINNED_AGGREGATOR = ("frl_femnist_trmean", "frl_femnist_mkrum")
# the setting every method of a preset shares
SHARED = ("dataset", "partition", "model", "num_clients", "clients_per_round", "rounds", "seed")
HETEROGENEOUS = ("heterogeneous", "data_reduction", "scalability500", "rbf")
# presets that only add a sweep, a size or a default method to a parent preset, or a twin at
# another attack fraction: their matrix is the parent's (each compose costs ~0.35 s of CPU), so
# make test-full composes them
THIN = ("_fedavg", "_k_sweep", "_weight_inits", "_compression", "_scalability500", "_attack10")
MATRIX = [pytest.param(p, marks=pytest.mark.slow) if p.endswith(THIN) else p for p in PRESETS]


def load(*overrides: str):
    """The composed config and Hydra's group choices, as the CLI would build them."""
    GlobalHydra.instance().clear()
    with initialize_config_dir(str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=list(overrides), return_hydra_config=True)
    choices = dict(cfg.hydra.runtime.choices)
    with open_dict(cfg):  # the config as the run gets it: without Hydra's own node
        del cfg["hydra"]
    OmegaConf.set_struct(cfg, False)
    return cfg, choices


def baselines(preset: str, paper: str | None, own: str) -> list[tuple[str, str | None]]:
    if preset.startswith(PINNED_AGGREGATOR):
        return [("fedavg", None)]
    return PAPER_BASELINES.get(paper, [(own, None), ("fedavg", None)])


def target(node) -> str:
    return node._target_.rsplit(".", 1)[-1]


def paper_of(preset: str) -> str | None:
    """The paper whose setting a preset is (its file selects `paper=` to match: asserted)."""
    return next((paper for paper in PAPER_BASELINES if preset.startswith(paper + "_")), None)


@pytest.mark.parametrize("preset", MATRIX)
def test_preset_runs_its_papers_baselines_in_one_setting(preset):
    paper = paper_of(preset)
    own = preset.split("_")[0]  # fedprox_synthetic: FedProx, with FedAvg its baseline
    if not (CONF / "algorithm" / f"{own}.yaml").exists():  # robustness_digits: FedAvg's grid
        own = "fedavg"
    runs, base = {}, None
    for algorithm, aggregator in baselines(preset, paper, own):
        extra = [f"aggregator={aggregator}"] if aggregator else []
        cfg, got = load(f"experiment={preset}", f"algorithm={algorithm}", *extra)
        assert got["algorithm"] == algorithm and got["experiment"] == preset
        assert got["paper"] == paper
        runs[(algorithm, aggregator)] = cfg
        base = base or cfg  # the paper's own method first
        for key in SHARED:  # the setting does not depend on the method
            assert cfg[key] == base[key], (algorithm, key)
        client = dict(cfg.client)
        own_lr = client.pop("lr")
        assert client == {k: v for k, v in base.client.items() if k != "lr"}, algorithm
        if paper != "frl":
            assert own_lr == base.client.lr, algorithm
        if aggregator:
            assert got["aggregator"] == aggregator
    check_method_values(preset, paper, runs)
    if paper == "fedhenn":  # the authors' code; the RAD of 5000 from a server pool of 10000
        assert base.client.weight_decay == 1e-4 and base.client.momentum == 0.5
        assert base.algorithm.rad_source == "server"  # the pool is in SHARED's `partition`
        assert base.partition.server_pool == 10000 > base.algorithm.rad_size
    if paper == "frl":  # a local test split for the clients' accuracies (the paper's Tables 2
        # and 4), no validation split (objective none); a malicious-majority round is re-drawn
        assert base.partition.test_fraction == 0.2 and base.partition.val_fraction == 0
        assert base.attack.redraw_majority is True


def check_method_values(preset: str, paper: str | None, runs: dict) -> None:
    """Each method-specific value is applied to its method and to no other."""
    for (algorithm, aggregator), cfg in runs.items():
        if paper == "fedhenn" and algorithm == "fedhenn":
            assert cfg.algorithm.rad_size == 5000
            assert cfg.algorithm.eta0 == (0.01 if "sent140" in preset else 0.001)
            heterogeneous = any(word in preset for word in HETEROGENEOUS)
            assert (cfg.algorithm.variant == "heterogeneous") == heterogeneous
            assert (cfg.algorithm.kernel == "rbf") == ("rbf" in preset)
            assert (cfg.algorithm.distance == "procrustes") == ("procrustes" in preset)
        elif algorithm == "fedhenn":
            pytest.fail(f"{preset}: fedhenn is not a baseline here")
        else:  # no FedHeNN key reaches another method
            assert "rad_size" not in cfg.algorithm and "variant" not in cfg.algorithm
        if algorithm == "fedprox":
            paper_mu = paper == "waffle" or preset == "fedprox_synthetic"
            assert cfg.algorithm.mu == (1.0 if paper_mu else 0.01)  # the default elsewhere
        if paper == "frl":  # the reference code's dense lr: 0.01 on MNIST, 0.02 elsewhere
            dense = 0.01 if preset.startswith("frl_mnist") else 0.02
            assert cfg.client.lr == (0.4 if algorithm == "frl" else dense), algorithm
            if algorithm in ("fedavg", "topk"):
                assert cfg.algorithm.weighting == "uniform"
            if aggregator is None:
                expected = {"frl": "rank_vote", "signsgd": "sign_vote"}.get(
                    algorithm, "weighted_mean"
                )
                if not preset.startswith(PINNED_AGGREGATOR):
                    assert target(cfg.aggregator) == expected
            check_attack(preset, algorithm, cfg)


def check_attack(preset: str, algorithm: str, cfg) -> None:
    """Under attack=frl_paper each method meets the attack FRL's Table 1 runs against it."""
    if "attack" not in preset or preset.startswith(PINNED_AGGREGATOR):
        assert "attack" in preset or target(cfg.attack) == "NoAttack"
        return
    fraction = 0.1 if preset.endswith("attack10") else 0.2
    expected = {"frl": "RankReversal", "fedavg": "AGRTailored"}.get(algorithm, "SignFlip")
    assert target(cfg.attack) == expected and cfg.attack.fraction == fraction


def test_the_missing_presets_exist():
    assert {
        "fedhenn_sent140_homogeneous",
        "fedhenn_sent140_heterogeneous",
        "frl_cifar10_compression",
        "frl_mnist_compression",
        "frl_mnist_attack10",
        "frl_mnist_attack20",
        "frl_cifar10_attack10",
        "frl_cifar10_attack20",
    } <= set(PRESETS)


def test_waffle_alone_runs_with_the_papers_local_training():
    cfg, choices = load("algorithm=waffle")
    assert choices["client"] == "waffle"
    assert (cfg.client.local_epochs, cfg.client.batch_size) == (5, 10)
    assert cfg.algorithm.unseen_mask == "all"  # the paper's never-queried client
    cfg, _ = load("algorithm=waffle", "client.local_epochs=1")
    assert (cfg.client.local_epochs, cfg.client.batch_size) == (1, 10)


def test_fedavg_keeps_the_general_client_defaults():
    cfg, choices = load("algorithm=fedavg")
    assert choices["client"] == "default"
    assert dict(cfg.client) == dict(OmegaConf.load(CONF / "client" / "default.yaml"))


def test_frl_and_fedhenn_alone_bring_their_local_training_and_dataset_values():
    cfg, _ = load("algorithm=frl")
    client = cfg.client
    assert (client.local_epochs, client.batch_size, client.lr, client.momentum) == (2, 8, 0.4, 0.9)
    assert target(cfg.aggregator) == "rank_vote"
    cfg, _ = load("algorithm=frl", "dataset=cifar10")
    assert cfg.client.local_epochs == 5  # the reference code's E on CIFAR-10
    cfg, _ = load("algorithm=fedhenn")
    client = cfg.client
    assert (client.local_epochs, client.momentum, client.weight_decay) == (20, 0.5, 1e-4)
    assert cfg.algorithm.eta0 == 0.01  # Sentiment140's (and the default)
    cfg, _ = load("algorithm=fedhenn", "dataset=cifar100", "client.lr=0.1")
    assert cfg.algorithm.eta0 == 0.001 and cfg.client.lr == 0.1


def test_a_presets_client_settings_apply_to_every_method():
    for algorithm in ("waffle", "fedavg", "fedprox"):
        cfg, _ = load("experiment=waffle_cifar10_unimodal", f"algorithm={algorithm}")
        assert (cfg.client.local_epochs, cfg.client.batch_size, cfg.client.lr) == (5, 10, 0.01)
