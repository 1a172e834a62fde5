"""The robustness grid presets (`experiment=robustness_digits`, `robustness_mnist1d`): the sweep
they declare names attacks and aggregators that exist, every attacked job has 20 % attackers,
Bulyan's n >= 4f + 3 holds in every round, and every aggregator sees the same client data."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

CONF = Path(__file__).resolve().parents[2] / "conf"
PRESETS = ("robustness_digits", "robustness_mnist1d")
ATTACKS = ["none", "sign_flip", "lie", "min_max", "ipm", "backdoor", "label_flip"]
AGGREGATORS = ["mean", "median", "trimmed_mean", "multikrum", "bulyan", "centered_clip"]
AGGREGATORS += ["geometric_median", "fltrust"]


def load(*overrides: str):
    GlobalHydra.instance().clear()
    with initialize_config_dir(str(CONF), version_base="1.3"):
        return compose("config", overrides=list(overrides), return_hydra_config=True)


@pytest.mark.parametrize("preset", PRESETS)
def test_the_preset_sweeps_every_attack_and_aggregator_at_a_fixed_fraction(preset):
    cfg = load(f"experiment={preset}")
    params = cfg.hydra.sweeper.params
    attacks, aggregators = params.attack.split(","), params.aggregator.split(",")
    assert (attacks, aggregators) == (ATTACKS, AGGREGATORS)  # the grid of the docs' table
    for group, names in (("attack", attacks), ("aggregator", aggregators)):
        for name in names:
            assert (CONF / group / f"{name}.yaml").is_file(), f"{group}={name}"
    # the preset leaves the fraction to the attacks (attack=none refuses a non-zero one): each
    # swept attack's own default is the grid's 20 %, and nothing in the preset changes it
    assert "attack" not in OmegaConf.load(CONF / "experiment" / f"{preset}.yaml")
    fractions = {a: OmegaConf.load(CONF / "attack" / f"{a}.yaml").fraction for a in attacks}
    assert fractions == {a: 0.0 if a == "none" else 0.2 for a in attacks}
    flip = load(f"experiment={preset}", "attack=sign_flip")
    assert flip.attack.fraction == 0.2
    # the most attackers a round can hold: int(0.2 N), at most a round; Bulyan needs 4f + 3
    f = min(int(0.2 * flip.num_clients), flip.clients_per_round)
    assert flip.clients_per_round >= 4 * f + 3 and f >= 1
    # FLTrust's root dataset, set aside for every aggregator alike (not `auto`, which would
    # take it only where fltrust runs and give its clients less data than the others')
    assert isinstance(cfg.partition.server_pool, int) and cfg.partition.server_pool > 0
    assert cfg.hydra.callbacks.sweep_summary.grid == "aggregator,attack"
    assert cfg.hydra.callbacks.sweep_summary.baseline == "attack=none"
    # a partition that is not iid
    assert cfg.partition._target_.rsplit(".", 1)[-1] in ("Dirichlet", "Shards")
