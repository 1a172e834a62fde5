"""Every incompatible configuration stops before training with one line and exit code 2, and
leaves no run dir behind. Add a row to BAD_CONFIGS for every new check."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from components import with_yaml
from conftest import main_in_process, write_sent140_csv
from fedexp.config.validation import config_rule, validate_config, with_checks
from fedexp.core.cohort import RoundResults
from fedexp.core.types import ConfigError

# stands for `dataset.data_dir=<a generated Sent140 CSV>` (written by `with_sent140`)
SENT140 = "dataset.data_dir=<sent140>"

# (overrides, a substring of the one-line message)
BAD_CONFIGS: list[tuple[tuple[str, ...], str]] = [
    (("partition=natural",), "partition: natural split needs a dataset with client ids"),
    (("malloc_keep=3",), "malloc_keep: must be true or false, got 3"),
    (
        ("executor=vectorized", "executor.stack=grouped"),
        "executor.stack: must be auto, vmap or loop, got 'grouped'",
    ),
    (("dataset=synthetic", "model=lenet5"), "model: fedexp.models.cnn.lenet5 needs image inputs"),
    (("dataset=synthetic", "model=cnn"), "model: fedexp.models.cnn.cnn needs image inputs"),
    (("dataset=cifar10",), "dataset.data_dir: CIFAR-10 not found"),
    (("partition.classes_per_client=11",), "partition.classes_per_client: 11 exceeds"),
    (("partition._target_=fedexp.data.schemes.Bogus",), "partition._target_: cannot import"),
    (("clients_per_round=50",), "clients_per_round: must be in [1, num_clients=6]"),
    (("client.lr=-1",), "client.lr: must be > 0"),
    (("algorithm=fedprox", "algorithm.mu=-1"), "algorithm.mu: must be >= 0"),
    (("algorithm=fedrep", "algorithm.body_epochs=2"), "algorithm.body_epochs: must be <= client"),
    (("algorithm._target_=fedexp.algorithms.nope.Nope",), "algorithm._target_: cannot import"),
    (("checkpoint_every=-1",), "checkpoint_every: must be an integer >= 0"),
    (("objective=accuracy",), "objective: 'accuracy' is not a metric"),
    # cross-component incompatibilities (issue 8)
    (("algorithm=frl", "aggregator=mean"), "aggregator: FRL uploads rankings and needs"),
    (("algorithm=frl", "aggregator=trimmed_mean"), "needs aggregator=rank_vote, got trimmed_mean"),
    (("aggregator=rank_vote",), "aggregator: rank_vote aggregates FRL rankings; FedAvg uploads"),
    (("algorithm=fedhenn", "model=cnn_family"), "model: algorithm.variant=homogeneous needs one"),
    # FedHeNN's RAD comes from the server pool; no pool, or one as large as the training set
    (("algorithm=fedhenn", "partition.server_pool=0"), "partition.server_pool: 0, but algorithm"),
    (
        ("partition.server_pool=1500", "partition.max_server_pool=null"),  # smoke's cap: 16
        "partition.server_pool: 1500 >= the 1438 training samples",
    ),
    (("partition.server_pool=-1",), "partition.server_pool: must be >= 0"),
    (  # `auto` resolved to what the algorithm asks for is held to the same rule
        ("algorithm=fedhenn", "algorithm.rad_source=server", "algorithm.rad_size=-5"),
        "partition.server_pool: must be >= 0, got -10",
    ),
    (("attack=rank_reversal",), "attack: rank_reversal cannot target FedAvg"),
    (("algorithm=signsgd", "attack=scaling"), "attack: scaling cannot target SignSGD"),
    (("algorithm=frl", "attack=sign_flip"), "attack: sign_flip cannot target FRL"),
    (("model=lstm",), "model: lstm needs a text dataset"),
    (("dataset=sent140", SENT140, "model=cnn"), "model: fedexp.models.cnn.cnn needs image inputs"),
    (("algorithm=waffle", "dataset=sent140", SENT140), "model: WAFFLe factorises linear and conv"),
    (("attack=sign_flip", "attack.fraction=1.5"), "attack.fraction: must be in [0, 1), got 1.5"),
    (("attack.fraction=0.3",), "attack.fraction: 0.3 with attack=none"),
    (
        ("dataset=mnist1d", "dataset.num_samples=605"),
        "dataset.num_samples: must be a multiple of 10 and >= 100",
    ),
    (("dataset=mnist1d", "dataset.test_fraction=0"), "dataset.test_fraction: must be in (0, 1)"),
    # keys the target does not take: one line naming the group and the options
    (("algorithm.k=0.5",), "algorithm.k: not an option of fedexp.algorithms.fedavg.FedAvg;"),
    (("algorithm=fedprox", "algorithm.muu=1"), "algorithm.muu: not an option of"),
    (("+algorithm.muu=1", "algorithm=fedrep"), "algorithm.muu: not an option of"),
    (
        ("algorithm=fedhenn", "algorithm.variant=heterogeneous", "algorithm.bogus=1"),
        "algorithm.bogus: not an option of fedexp.algorithms.fedhenn.fedhenn",
    ),
    (("model.depth=3",), "model.depth: not an option of fedexp.models.mlp.mlp; options: hidden"),
    (("dataset.foo=1",), "dataset.foo: not an option of fedexp.data.datasets.load_digits"),
    (("attack=scaling", "attack.factr=2"), "attack.factr: not an option of"),
    (("client.lrr=0.1",), "client.lrr: no such key in the config"),
    (("~client.lr",), "client.lr: missing"),
    # types and ranges, before anything is written (an int is not a bool or a float)
    (("rounds=abc",), "rounds: must be an int, got 'abc'"),
    (("rounds=2.5",), "rounds: must be an int, got 2.5"),
    (("rounds=null",), "rounds: must be an int, got None"),
    (("rounds=true",), "rounds: must be an int, got True"),
    (("num_clients=6.0",), "num_clients: must be an int, got 6.0"),
    (("client.lr=fast",), "client.lr: must be a number, got 'fast'"),
    (("client.batch_size=1.5",), "client.batch_size: must be an int, got 1.5"),
    (("algorithm=fedprox", "algorithm.mu=abc"), "algorithm.mu: must be a number, got 'abc'"),
    (("seed=-1",), "seed: must be >= 0, got -1"),
    (("client.momentum=-1",), "client.momentum: must be >= 0, got -1"),
    (("client.weight_decay=-1",), "client.weight_decay: must be >= 0, got -1"),
    (("client.local_epochs=0",), "client.local_epochs: must be >= 1, got 0"),
    (("partition.classes_per_client=0",), "partition.classes_per_client: must be >= 1, got 0"),
    (("partition.classes_per_client=two",), "partition.classes_per_client: must be an int"),
    (("progress=maybe",), "progress: must be true or false, got 'maybe'"),
    (("model.hidden=[64,x]",), "model.hidden: must be a list of ints, got [64, 'x']"),
    (("attack=scaling", "attack.factor=big"), "attack.factor: must be a number, got 'big'"),
    # robust aggregators' options that no round of clients_per_round=3 uploads can honour
    (
        ("aggregator=trimmed_mean", "aggregator.beta=2"),
        "aggregator.beta: 2 trims 2 per side, leaving nothing of the 3 uploads of a round",
    ),
    (
        ("aggregator=multikrum", "aggregator.f=1"),
        "aggregator.f: 1 means 1 malicious of the 3 uploads of a round (clients_per_round=3); "
        "Multi-Krum needs clients_per_round > 2f + 2",
    ),
    (
        ("aggregator=multikrum", "aggregator.f=0", "aggregator.num_selected=4"),
        "aggregator.num_selected: 4 > the 3 uploads of a round",
    ),
]


def cli_in_process(tmp_path, monkeypatch, capsys, *overrides) -> tuple[int, str]:
    """`python -m fedexp debug=smoke overrides...` in this process: (exit code, stderr)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FEDEXP_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("FEDEXP_DATA_DIR", str(tmp_path / "data"))
    return main_in_process(monkeypatch, capsys, "debug=smoke", *overrides)


def with_sent140(overrides: tuple[str, ...], root: Path) -> tuple[str, ...]:
    """`overrides` with SENT140 replaced by a Sent140 CSV written under root."""
    if SENT140 not in overrides:
        return overrides
    data = write_sent140_csv(root / "sent140")
    return tuple(f"dataset.data_dir={data}" if o == SENT140 else o for o in overrides)


@pytest.mark.experiment
@pytest.mark.parametrize(("overrides", "expected"), BAD_CONFIGS)
def test_bad_config_is_one_line_exit_2_and_no_run_dir(
    tmp_path, monkeypatch, capsys, overrides, expected
):
    overrides = with_sent140(overrides, tmp_path)
    code, err = cli_in_process(tmp_path, monkeypatch, capsys, *overrides)
    assert code == 2, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines == [lines[0]] and lines[0].startswith("fedexp: error: ")
    assert expected in lines[0], lines[0]
    assert not list((tmp_path / "outputs").rglob(".hydra"))  # no run dir left behind


@pytest.mark.cli
@pytest.mark.slow
@pytest.mark.parametrize(("overrides", "expected"), BAD_CONFIGS)
def test_the_same_through_a_real_process(tmp_path, overrides, expected):
    env = dict(os.environ, FEDEXP_CACHE_DIR=str(tmp_path / "c"), OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2] / "src")
    overrides = with_sent140(overrides, tmp_path)
    proc = subprocess.run(
        [sys.executable, "-m", "fedexp", "debug=smoke", *overrides],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [proc.stderr.strip()]
    assert expected in proc.stderr
    assert not list((tmp_path / "outputs").rglob(".hydra"))


# ---- the registry itself -------------------------------------------------------------------------
class NeedsEvenRounds:
    """A stand-in component class declaring its own check."""

    @classmethod
    def check_config(cls, cfg) -> None:
        if cfg.rounds % 2:
            raise ConfigError(f"rounds: NeedsEvenRounds needs an even number, got {cfg.rounds}")


def _no_digits(cfg) -> None:
    raise ConfigError("dataset: this factory refuses every dataset")


@with_checks(config=_no_digits)
def picky_factory(input_shape, num_classes):
    """A stand-in model factory declaring a check."""


def config_with(**nodes):
    base = {"rounds": 3, "checkpoint_every": 0}
    return OmegaConf.create({**base, **nodes})


def test_a_component_class_declares_its_check():
    name = f"{__name__}.NeedsEvenRounds"
    with pytest.raises(ConfigError, match="rounds: NeedsEvenRounds needs an even number, got 3"):
        validate_config(config_with(algorithm={"_target_": name}))
    validate_config(config_with(algorithm={"_target_": name}, rounds=4))


def test_a_function_component_declares_its_check_with_with_checks():
    node = {"_target_": f"{__name__}.picky_factory", "_partial_": True}
    with pytest.raises(ConfigError, match="this factory refuses"):
        validate_config(config_with(model=node))


def test_a_registered_rule_runs_on_every_config(monkeypatch):
    from fedexp.config import validation as validation

    monkeypatch.setattr(validation, "CONFIG_RULES", list(validation.CONFIG_RULES))

    @config_rule
    def no_three_rounds(cfg):
        if cfg.rounds == 3:
            raise ConfigError("rounds: not 3")

    with pytest.raises(ConfigError, match="rounds: not 3"):
        validate_config(config_with())


# ---- what is capped or rounded at run time is said once ----------------------------------------
def test_a_cap_that_only_some_rounds_hit_is_a_warning_once(caplog):
    import torch

    from fedexp.aggregators import _warned
    from fedexp.aggregators.multikrum import multikrum
    from fedexp.aggregators.trimmed_mean import trimmed_mean

    multikrum = with_yaml(multikrum, "aggregator", "multikrum")
    trimmed_mean = with_yaml(trimmed_mean, "aggregator", "trimmed_mean")

    _warned.clear()
    updates = torch.tensor([[1.0], [2.0], [9.0]])
    weights = torch.ones(3)
    with caplog.at_level("WARNING"):
        # beta=known with 2 malicious of 3: trimming 2 per side leaves nothing; 1 is trimmed
        assert trimmed_mean(updates, weights, num_malicious=2).item() == 2.0
        assert trimmed_mean(updates, weights, num_malicious=2).item() == 2.0
        assert trimmed_mean(updates, weights, num_malicious=1).item() == 2.0
        multikrum(updates, weights, num_malicious=1)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines
    assert lines[0].startswith("aggregator.beta: trimming 2 per side of 3 uploads")
    assert lines[1].startswith("aggregator.f: 1 of 3 uploads is more than Multi-Krum allows")


@pytest.mark.parametrize(
    ("fraction", "num_clients", "malicious", "warned"),
    [(0.05, 6, 0, True), (0.2, 6, 1, True), (0.2, 10, 2, False), (0.3, 10, 3, False)],
)
def test_an_attack_says_when_its_fraction_rounds_and_logs_the_realised_one(
    caplog, fraction, num_clients, malicious, warned
):
    from types import SimpleNamespace

    from fedexp.attacks.transform import Scaling

    Scaling = with_yaml(Scaling, "attack", "scaling")

    attack = Scaling(fraction=fraction)
    with caplog.at_level("WARNING"):
        attack.setup(SimpleNamespace(seed=0), num_clients)
    assert len(attack.malicious) == malicious
    assert attack.round_metrics(RoundResults.empty())["attack/fraction"] == malicious / num_clients
    lines = [r.getMessage() for r in caplog.records]
    assert lines == (
        [
            f"attack.fraction: {fraction} of {num_clients} clients makes {malicious} malicious "
            f"(realised fraction {malicious / num_clients:.4g})"
        ]
        if warned
        else []
    )


@pytest.mark.experiment
@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (("model.bias=1",), "model.bias: not an option of fedexp.models.mlp.mlp; options: hidden"),
        (("algorithm=fedprox", "algorithm.muu=0.1"), "algorithm.muu: not an option of"),
        (("+dataset.foo=1",), "dataset.foo: not an option of fedexp.data.datasets.load_digits"),
    ],
)
def test_a_key_the_target_does_not_take_is_refused_before_any_data_is_read(
    tmp_path, monkeypatch, capsys, overrides, expected
):
    import fedexp.run.components

    def read(*args, **kwargs):
        raise AssertionError("the data were read")

    monkeypatch.setattr(fedexp.run.components, "build_data", read)
    code, err = cli_in_process(tmp_path, monkeypatch, capsys, *overrides)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("fedexp: error: "), err
    assert expected in lines[0], err
