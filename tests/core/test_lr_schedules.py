"""Learning-rate schedules across rounds (`client.lr_schedule`, `fedexp.core.local`): each
schedule's lr by hand, the round's lr in the optimizer on both executors, one FedAvg round equal
to a hand-written SGD step at that lr, bad values refused, the constant schedule as before."""

from __future__ import annotations

import math

import pytest
import torch

from components import with_yaml
from fedexp.algorithms.fedavg import FedAvg
from fedexp.core.local import ClientConfig, LRSchedule, optimizer_lrs
from fedexp.core.types import ConfigError
from fedexp.engine.executors.sequential import SequentialExecutor
from fedexp.engine.executors.vectorized import VectorizedExecutor
from handworld import client_cfg, make_ctx, one_round

FedAvg = with_yaml(FedAvg, "algorithm", "fedavg")

EXECUTORS = {
    "sequential": SequentialExecutor,
    "vectorized": lambda: VectorizedExecutor(None, False, False, "cpu", "vmap"),
}


def lrs(lr: float, schedule: LRSchedule, rounds) -> list[float]:
    return [schedule.at(lr, t) for t in rounds]


def test_each_schedule_by_hand():
    # exponential: lr·γ^(t−1); γ = 0.5 at t = 3 is lr/4
    assert lrs(0.8, LRSchedule("exponential", decay=0.5), (1, 2, 3)) == [0.8, 0.4, 0.2]
    # step: lr·γ^floor((t−1)/S), S = 2
    step = LRSchedule("step", decay=0.5, step_rounds=2)
    assert lrs(0.8, step, (1, 2, 3, 4, 5)) == [0.8, 0.8, 0.4, 0.4, 0.2]
    # cosine over T = 4 rounds to lr_min = 0.1: lr at t = 1; t = 3: 0.1 + 0.9·(1 + cos(π/2))/2
    cosine = LRSchedule("cosine", min=0.1, rounds=4)
    assert cosine.at(1.0, 1) == 1.0
    assert cosine.at(1.0, 3) == pytest.approx(0.55, abs=1e-15)
    last = 0.1 + 0.9 * (1 - math.sqrt(2) / 2) / 2  # t = T: cos(3π/4) = −√2/2
    assert cosine.at(1.0, 4) == pytest.approx(last, abs=1e-15) == pytest.approx(0.2318019, 1e-6)
    # warmup: lr·t/W up to W = 4, then lr
    warm = LRSchedule("warmup", warmup_rounds=4)
    assert lrs(0.8, warm, (1, 2, 3, 4, 5, 90)) == pytest.approx([0.2, 0.4, 0.6, 0.8, 0.8, 0.8])
    # constant: the lr itself, untouched, whatever the round
    lr = 0.1234567
    assert all(LRSchedule().at(lr, t) is lr for t in (1, 7, 10_000))


def test_client_config_lr_at_and_defaults():
    client = client_cfg(lr=0.8, lr_schedule="exponential", lr_decay=0.5)
    assert [client.lr_at(t) for t in (1, 2, 3)] == [0.8, 0.4, 0.2]
    assert client.round_spec(3) == ("sgd", {"lr": 0.2, "weight_decay": 0.0, "momentum": 0.0})
    plain = client_cfg()
    assert (plain.lr_schedule, plain.lr_decay, plain.lr_step_rounds) == ("constant", 0.999, 10)
    assert (plain.lr_min, plain.lr_warmup_rounds, plain.rounds) == (0.0, 5, None)
    assert plain.lr_at(50) == plain.lr and plain.optimizer_spec == plain.round_spec(50)
    cosine = ClientConfig.from_mapping(
        {**BASE, "lr": 1.0, "lr_schedule": "cosine", "lr_min": 0.1}, rounds=4
    )
    assert cosine.rounds == 4 and cosine.lr_at(3) == pytest.approx(0.55)


BASE = dict(local_epochs=1, batch_size=1, optimizer="sgd", lr=0.1, momentum=0.0, weight_decay=0.0)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"lr_schedule": "linear"}, "client.lr_schedule: must be one of ['constant', 'cosine'"),
        ({"lr_schedule": 3}, "client.lr_schedule: must be a string, got 3"),
        ({"lr_decay": 0}, "client.lr_decay: must be in (0, 1], got 0"),
        ({"lr_decay": 1.5}, "client.lr_decay: must be in (0, 1], got 1.5"),
        ({"lr_step_rounds": 0}, "client.lr_step_rounds: must be >= 1, got 0"),
        ({"lr_step_rounds": 2.5}, "client.lr_step_rounds: must be an int, got 2.5"),
        ({"lr_min": -0.1}, "client.lr_min: must be >= 0, got -0.1"),
        ({"lr_warmup_rounds": 0}, "client.lr_warmup_rounds: must be >= 1, got 0"),
        ({"lr_schedule": "cosine"}, "client.lr_schedule: cosine needs the run's total rounds"),
        (
            {"lr_schedule": "cosine", "lr_min": 0.5, "rounds": 4},
            "client.lr_min: must be <= the lr it anneals from (0.1), got 0.5",
        ),
        (
            {"optimizer": "module", "lr_schedule": "step"},
            "client.lr_schedule: set the lr of client.optimizer=module",
        ),
    ],
)
def test_bad_schedule_values_are_refused_naming_the_key(change, message):
    with pytest.raises(ConfigError) as err:
        ClientConfig(**{**BASE, **change})
    assert str(err.value).startswith(message), err.value


@pytest.mark.experiment
def test_a_bad_schedule_is_one_line_exit_2_before_training(monkeypatch, capsys, tmp_path):
    from conftest import main_in_process

    monkeypatch.chdir(tmp_path)
    code, err = main_in_process(
        monkeypatch, capsys, "debug=smoke", "client.lr_schedule=step", "client.lr_decay=2"
    )
    assert code == 2 and err.count("\n") == 1, err
    assert err == "fedexp: error: client.lr_decay: must be in (0, 1], got 2\n"
    assert not (tmp_path / "outputs").exists() or not list((tmp_path / "outputs").rglob("*.csv"))


def spy_lrs(algo) -> list:
    """The param groups' lrs of every optimizer the module's `configure_optimizers` makes."""
    seen = []
    make = algo.module.configure_optimizers

    def spy():
        optimizer = make()
        seen.append(optimizer_lrs(optimizer))
        return optimizer

    algo.module.configure_optimizers = spy
    return seen


@pytest.mark.parametrize("executor", sorted(EXECUTORS))
def test_the_rounds_lr_reaches_the_optimizer_and_the_update(two_clients, executor):
    # zero weights: softmax = [.5, .5]; one SGD step each at lr η moves client 0 to
    # W = η·[[.5, 1], [−.5, −1]], client 1 to W = η·[[−1, 0], [1, 0]] (biases ±η/2, cancelling):
    # their mean is η·[[−.25, .5], [.25, −.5]]. Round 3 of γ = 0.5 from lr 0.1: η = 0.025
    algo = FedAvg(make_ctx(two_clients, lr=0.1, lr_schedule="exponential", lr_decay=0.5))
    seen = spy_lrs(algo)
    _, results, new, _ = one_round(algo, two_clients, executor=EXECUTORS[executor](), round_idx=3)
    assert seen and all(lrs == (0.025,) for lrs in seen)
    eta = 0.025
    expected = eta * torch.tensor([[-0.25, 0.5], [0.25, -0.5]])
    assert torch.allclose(new.params[:4], expected.reshape(-1), atol=1e-9)
    assert torch.allclose(new.params[4:], torch.zeros(2), atol=1e-9)
    assert algo.round_lrs(3) == {"train/client_lr": 0.025, "train/server_lr": 1.0}


@pytest.mark.parametrize("executor", sorted(EXECUTORS))
def test_constant_trains_as_before_bit_for_bit(two_clients, executor):
    # an explicit constant schedule is the default; a schedule at its round-1 lr (warm-up of
    # W = 1) builds the same optimizer: both the plain client bit for bit
    runs = []
    for kw in ({}, {"lr_schedule": "constant"}, {"lr_schedule": "warmup", "lr_warmup_rounds": 1}):
        algo = FedAvg(make_ctx(two_clients, seed=3, lr=0.1, **kw))
        runs.append(one_round(algo, two_clients, executor=EXECUTORS[executor](), round_idx=7)[2])
    assert torch.equal(runs[0].params, runs[1].params)
    assert torch.equal(runs[0].params, runs[2].params)
