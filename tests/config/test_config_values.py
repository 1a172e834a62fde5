"""Values that are simply wrong are refused in one line naming the key, before the data is
loaded and with no run dir left: NaN and ±inf in any option, a seed out of range, an
interpolation that does not resolve, a required key deleted, a directory option naming a file."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from omegaconf import OmegaConf, open_dict

from conftest import main_in_process
from fedexp.config.values import check_config_values
from fedexp.errors import ConfigError

pytestmark = pytest.mark.experiment

REPO = Path(__file__).resolve().parents[2]
GROUPS = ("algorithm", "aggregator", "attack", "partition", "client", "privacy", "dataset")


def float_knobs() -> list[tuple[str, str, str]]:
    """(group, option, key) of every number-valued option in the YAMLs of those groups."""
    found = []
    for group in GROUPS:
        for path in sorted((REPO / "conf" / group).glob("*.yaml")):
            node = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
            for key, value in (node or {}).items():
                if isinstance(value, float):
                    found.append((group, path.stem, key))
    return found


def test_nan_and_inf_in_any_float_option_of_any_component_are_refused(compose_cfg):
    base = compose_cfg()
    knobs = float_knobs()
    assert len(knobs) > 40 and {g for g, _, _ in knobs} == set(GROUPS) - {"aggregator", "privacy"}
    # options that take a float where the YAML holds another value (or an int): refused alike
    knobs += [("aggregator", "trimmed_mean", "beta"), ("aggregator", "multikrum", "f")]
    knobs += [("privacy", "mia", "max_samples"), ("attack", "scaling", "fraction")]
    for i, (group, option, key) in enumerate(knobs):
        path = REPO / "conf" / group / f"{option}.yaml"
        node = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
        bad = (math.nan, math.inf, -math.inf)[i % 3]
        cfg = base.copy()
        with open_dict(cfg):
            cfg[group] = {k: v for k, v in node.items() if k != "defaults"}
            cfg[group][key] = bad
        with pytest.raises(ConfigError) as err:
            check_config_values(cfg)
        assert str(err.value) == f"{group}.{key}: must be a finite number, got {bad}", option
    check_config_values(base)  # and the defaults pass


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("seed=18446744073709551616",), "seed: must be < 2**63, got 18446744073709551616"),
        (("algorithm=fedprox", "algorithm.mu=nan"), "algorithm.mu: must be a finite number, got"),
        (("algorithm.server_lr=inf",), "algorithm.server_lr: must be a finite number, got inf"),
        (
            ("+algorithm.extra=${nope}",),
            "algorithm.extra: ${nope} does not resolve (Interpolation key 'nope' not found)",
        ),
        (
            ("num_clients=${oc.env:FEDEXP_TEST_UNSET}",),
            "num_clients: ${oc.env:FEDEXP_TEST_UNSET} does not resolve (Environment variable "
            "'FEDEXP_TEST_UNSET' not found)",
        ),
        (("~rounds",), "rounds: missing from the config (removed with ~rounds?)"),
        (("paths.cache_dir=a_file",), "paths.cache_dir: a_file is a file, not a directory"),
        (
            ("client_store.spill_dir=a_file/spill",),
            "client_store.spill_dir: a_file/spill is under a_file, which is a file",
        ),
    ],
)
def test_a_wrong_value_is_refused_naming_its_key(
    compose_cfg, tmp_path, monkeypatch, args, expected
):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("FEDEXP_TEST_UNSET", raising=False)
    (tmp_path / "a_file").write_text("")
    with pytest.raises(ConfigError) as err:
        check_config_values(compose_cfg(*args))
    assert str(err.value).startswith(expected) and "\n" not in str(err.value)


def test_the_cli_refuses_a_nan_in_one_line_before_the_data_and_leaves_no_run_dir(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FEDEXP_CACHE_DIR", str(tmp_path / "cache"))
    args = ("debug=smoke", "hydra.run.dir=run", "partition=dirichlet", "partition.beta=nan")
    code, err = main_in_process(monkeypatch, capsys, *args)
    assert code == 2
    assert err == "fedexp: error: partition.beta: must be a finite number, got nan\n"
    assert not (tmp_path / "run").exists()  # refused before anything stays
    assert not (tmp_path / "cache").exists()  # before the data (and its cache)
