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
from fedexp.core.local import ClientConfig
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
    assert len(knobs) > 40 and {g for g, _, _ in knobs} == set(GROUPS) - {"privacy"}
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


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("rounds=0", "client.lr=0"), "rounds: must be >= 1, got 0"),  # the run scalars first
        (("client.lr=0", "partition.server_pool=-1"), "client.lr: must be > 0, got 0"),
        (("client.lr=nan",), "client.lr: must be a finite number, got nan"),  # not a range
        (("~client.lr",), "client.lr: missing"),
    ],
)
def test_the_client_settings_are_checked_by_their_owner_in_their_place(compose_cfg, args, expected):
    with pytest.raises(ConfigError) as err:
        check_config_values(compose_cfg(*args))
    assert str(err.value) == expected


def test_the_checks_hand_on_the_runs_one_client_config(compose_cfg):
    checked = check_config_values(compose_cfg("client.lr=1"))
    assert checked.client == ClientConfig(1, 32, "sgd", 1.0, 0.0, 0.0, rounds=2)
    assert checked.values["client"]["lr"] == 1  # the config as resolved


def test_a_run_checks_its_config_values_and_client_settings_once(tmp_path, monkeypatch, capsys):
    # before: `python -m fedexp` checked the values, then `check_types` again, then
    # `ClientConfig` the client settings a third time
    import fedexp.__main__ as entry
    import fedexp.config.values as values
    import fedexp.run.components as components

    calls = {"values": 0, "client": 0}
    check, post_init = values.check_config_values, ClientConfig.__post_init__

    def counted_check(cfg):
        calls["values"] += 1
        return check(cfg)

    def counted_post_init(self):
        calls["client"] += 1
        post_init(self)

    monkeypatch.setattr(values, "check_config_values", counted_check)
    monkeypatch.setattr(components, "check_config_values", counted_check)
    monkeypatch.setattr(ClientConfig, "__post_init__", counted_post_init)
    built = []
    monkeypatch.setattr(entry, "_run_or_fail", lambda *args: built.append(args[0]))  # no rounds
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FEDEXP_CACHE_DIR", str(tmp_path / "cache"))
    code, err = main_in_process(monkeypatch, capsys, "debug=smoke", "hydra.run.dir=run")
    assert (code, len(built)) == (0, 1), err
    assert calls == {"values": 1, "client": 1}
    assert built[0].client is built[0].algorithm.ctx.client  # the one ClientConfig, handed on
