"""The newer baselines run in one preset of each paper, in that preset's shared setting.

Composition only, one preset per paper (tests/config/test_presets_baselines.py composes every
preset with the paper's own baselines); the paper's config names the command that runs them.
"""

from __future__ import annotations

import pytest
from tests.config.test_presets_baselines import CONF, SHARED, load, target

# paper: (a preset of it, the newer baselines its paper config lists)
NEW = {
    "fedhenn": ("fedhenn_cifar10_heterogeneous", ["fedper", "ditto", "fedproto", "local"]),
    "waffle": ("waffle_cifar10_multimodal", ["qffl", "ditto", "scaffold", "local"]),
    "frl": ("frl_mnist_attack20", ["scaffold", "fedopt"]),
}


@pytest.mark.parametrize("paper", sorted(NEW))
def test_newer_baselines_share_the_presets_setting(paper):
    preset, algorithms = NEW[paper]
    assert "algorithm=" + ",".join(algorithms) in (CONF / "paper" / f"{paper}.yaml").read_text()
    own, _ = load(f"experiment={preset}")
    for algorithm in algorithms:
        cfg, choices = load(f"experiment={preset}", f"algorithm={algorithm}")
        assert choices["algorithm"] == algorithm and choices["paper"] == paper
        for key in SHARED:
            assert cfg[key] == own[key], (algorithm, key)
        assert "rad_size" not in cfg.algorithm  # no FedHeNN value reaches another method
        if paper == "frl":  # the dense baselines' step, one client one vote, the paper's attack
            assert cfg.client.lr == 0.01 and cfg.algorithm.weighting == "uniform"  # MNIST
            assert target(cfg.attack) == "AGRTailored" and cfg.attack.fraction == 0.2
        else:
            assert cfg.client == own.client, algorithm
