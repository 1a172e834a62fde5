"""System heterogeneity (`client.local_work`): each client's epochs or steps drawn per round, the
same on every executor; a step budget cuts the last epoch short; FedNova's normaliser follows the
steps each client took; algorithms with phases of their own are refused before training."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch

from fedexp.algorithms.fedavg import CONSTANT_SERVER_LR, FedAvg
from fedexp.core.client_loop import train_local
from fedexp.core.local import ClientConfig
from fedexp.engine.executors.schedule import schedule
from fedexp.errors import ConfigError
from fedexp.run import Experiment
from handworld import client_cfg, make_ctx, one_client_data

SHORT = ("rounds=3", "eval_every=3", "checkpoint_every=0")


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (
            {"local_work_range": [2, 5]},
            "client.local_work_range: client.local_work=fixed trains client.local_epochs and "
            "ignores the range; set client.local_work=epochs or steps, got [2, 5]",
        ),
        (
            {"local_work": "steps"},
            "client.local_work_range: client.local_work=steps draws each client's work from "
            "it; set it as [lo, hi], e.g. client.local_work_range=[2,5]",
        ),
        (
            {"local_work": "rounds", "local_work_range": [1, 2]},
            "client.local_work: must be one of ['epochs', 'fixed', 'steps'], got 'rounds'",
        ),
        (
            {"local_work": "epochs", "local_work_range": [0, 3]},
            "client.local_work_range: must be [lo, hi] with 1 <= lo <= hi, got [0, 3]",
        ),
        (
            {"local_work": "epochs", "local_work_range": [4, 3]},
            "client.local_work_range: must be [lo, hi] with 1 <= lo <= hi, got [4, 3]",
        ),
        (
            {"local_work": "epochs", "local_work_range": [1, 2.5]},
            "client.local_work_range: must be [lo, hi], two ints, got [1, 2.5]",
        ),
        (
            {"local_work": "epochs", "local_work_range": [1, 2, 3]},
            "client.local_work_range: must be [lo, hi], two ints, got [1, 2, 3]",
        ),
        (
            {"local_work": "epochs", "local_work_range": "2-5"},
            "client.local_work_range: must be [lo, hi], two ints, got '2-5'",
        ),
        (
            {"local_work": "epochs", "local_work_range": [True, 2]},
            "client.local_work_range: must be [lo, hi], two ints, got [True, 2]",
        ),
    ],
)
def test_bad_local_work_is_one_line(change, says):
    with pytest.raises(ConfigError) as err:
        client_cfg(**change)
    assert str(err.value) == says


def test_draws_cover_the_range_uniformly_per_client_and_round():
    cfg = client_cfg(local_work="steps", local_work_range=[2, 5])
    draws = [cfg.work(7, t, c) for t in range(1, 101) for c in range(20)]
    assert set(draws) == {2, 3, 4, 5}
    counts = Counter(draws)
    # 2000 draws of 4 values: each count is 500 +- 4.5 standard deviations (sqrt(2000 .25 .75))
    assert all(abs(counts[v] - 500) < 4.5 * 19.4 for v in (2, 3, 4, 5)), counts
    # a function of (seed, round, client): the same again, and another seed draws otherwise
    assert draws == [cfg.work(7, t, c) for t in range(1, 101) for c in range(20)]
    assert draws != [cfg.work(8, t, c) for t in range(1, 101) for c in range(20)]
    # the clients of a round do not all draw alike, nor does a client every round
    assert len({cfg.work(7, 1, c) for c in range(20)}) > 1
    assert len({cfg.work(7, t, 3) for t in range(1, 21)}) > 1
    assert client_cfg().work(7, 1, 0) is None  # fixed: no draw
    assert client_cfg(local_work="epochs", local_work_range=[3, 3]).work(7, 1, 0) == 3


def test_a_budget_is_whole_epochs_or_steps_cutting_the_last_epoch_short():
    steps = client_cfg(batch_size=2, local_work="steps", local_work_range=[1, 9])
    # n = 5, B = 2: 3 steps an epoch
    assert steps.budget(3, 5) == (1, 3)
    assert steps.budget(4, 5) == (2, 4)
    assert steps.budget(7, 5) == (3, 7)
    assert steps.budget(4, 0) == (0, 4)  # no data: no pass, no step
    epochs = client_cfg(batch_size=2, local_work="epochs", local_work_range=[1, 9])
    assert epochs.budget(4, 5) == (4, None)
    assert steps.budget(None, 5) is None


def batches_seen(budget, n=5, batch_size=2):
    """The batches (sample indices) a client of `n` samples trains on under `budget`, and what
    `train_local` says it did."""
    data = one_client_data(n)
    algo = FedAvg(make_ctx(data, batch_size=batch_size), "samples", 1.0, 0.0, **CONSTANT_SERVER_LR)
    module = algo.client_module(0)
    x, y = data.train(0)
    seen = []
    step = module.training_step

    def watched(batch, batch_idx):
        seen.append([int(torch.nonzero((x == row).all(1))[0]) for row in batch[0]])
        return step(batch, batch_idx)

    module.training_step = watched
    trained = train_local(module, x, y, batch_size, torch.Generator().manual_seed(3), None, budget)
    return seen, trained


def test_a_step_budget_takes_the_first_k_batches_of_fresh_shuffles():
    g = torch.Generator().manual_seed(3)
    first, second = torch.randperm(5, generator=g).tolist(), torch.randperm(5, generator=g).tolist()
    seen, trained = batches_seen((2, 4))  # K = 4 steps: epoch 1's 3 batches, then 1 of epoch 2
    assert seen == [first[0:2], first[2:4], first[4:5], second[0:2]]
    assert trained.steps == 4 and trained.phases[0].epochs == 2 and trained.phases[0].steps == 4
    seen, trained = batches_seen((3, None))  # E = 3 epochs: 9 steps
    assert len(seen) == trained.steps == 9 and seen[:3] == [first[0:2], first[2:4], first[4:5]]
    seen, trained = batches_seen(None)  # the module's own phase: client.local_epochs = 1
    assert seen == [first[0:2], first[2:4], first[4:5]] and trained.steps == 3


def test_the_stacked_schedule_cuts_each_client_at_its_own_step():
    # client 0: 5 samples, B = 2, epochs [4 0 2 1 3], [1 3 0 2 4], capped at 4 steps;
    # client 1: 2 samples, one epoch, every step (1)
    orders = [[np.array([4, 0, 2, 1, 3]), np.array([1, 3, 0, 2, 4])], [np.array([1, 0])]]
    idx, valid, active, everyone = schedule(orders, [5, 2], 2, [4, None]).to("cpu")
    assert idx[0].tolist() == [[4, 0], [2, 1], [3, 0], [1, 3]]
    assert valid[0].tolist() == [[True, True], [True, True], [True, False], [True, True]]
    assert active.tolist() == [[True] * 4, [True, False, False, False]]
    assert idx[1, 0].tolist() == [6, 5] and everyone == [True, False, False, False]


@pytest.mark.experiment
@pytest.mark.parametrize(
    "overrides",
    [
        ("algorithm=fedrep",),
        ("algorithm=ditto",),
        ("algorithm=centralised",),
        ("algorithm=frl", "algorithm.local_lr_schedule=cosine"),
    ],
    ids=["fedrep", "ditto", "centralised", "frl-cosine"],
)
def test_phases_of_their_own_are_refused_before_training(compose_cfg, tmp_path, overrides):
    cfg = compose_cfg(*overrides, "client.local_work=epochs", "client.local_work_range=[1,3]")
    with pytest.raises(ConfigError, match="^client.local_work: .* trains phases of its own"):
        Experiment(cfg, tmp_path)


@pytest.mark.experiment
def test_fednova_steps_are_the_drawn_steps_of_each_client(compose_cfg, lifecycle, tmp_path):
    # plain SGD: ||a_i||_1 = K_i, so tau_eff = sum_i p_i K_i with p_i = n_i / sum_j n_j
    cfg = compose_cfg(
        *SHORT, "algorithm=fednova", "client.local_work=steps", "client.local_work_range=[1,9]"
    )
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    exp = Experiment(cfg, run_dir)
    rounds = []
    run = exp.executor.run

    def recorded(algorithm, payloads, ctx, data, stats=None):
        results = run(algorithm, payloads, ctx, data, stats)
        rounds.append((ctx, results))
        return results

    exp.components.executor.run = recorded
    exp.run()
    rows = lifecycle.rows(run_dir)
    client = exp.components.client
    for (ctx, results), row in zip(rounds, rows):
        drawn = [client.work(cfg.seed, ctx.round, c) for c in ctx.client_ids]
        assert list(results.num_steps) == drawn
        sizes = [exp.data.num_train(c) for c in ctx.client_ids]
        tau = sum(n * k for n, k in zip(sizes, drawn)) / sum(sizes)
        assert row["fednova/tau_eff"] == pytest.approx(tau, rel=1e-6)
        assert row["clients/local_steps_min"] == min(drawn)
        assert row["clients/local_steps_max"] == max(drawn)
        assert row["clients/local_steps_mean"] == pytest.approx(sum(drawn) / len(drawn))
    assert len(rows) == 3 and len({r["clients/local_steps_mean"] for r in rows}) > 1


@pytest.mark.experiment
def test_a_resumed_heterogeneous_run_ends_as_an_uninterrupted_one(compose_cfg, lifecycle, tmp_path):
    cfg = compose_cfg(
        "rounds=3", "eval_every=1", "checkpoint_every=0", "client.local_work=epochs",
        "client.local_work_range=[1,3]", "dropout=0.3",
    )  # fmt: skip
    ref = lifecycle.run(cfg, tmp_path / "reference")
    run_dir = tmp_path / "stopped"
    stopped = lifecycle.run(cfg, run_dir, callbacks=[lifecycle.SignalAfter(1)])
    assert stopped["rounds_completed"] == 1
    resumed = lifecycle.run(cfg, run_dir, resume=True)
    assert lifecycle.final(resumed) == lifecycle.final(ref)
    assert lifecycle.rows(run_dir) == lifecycle.rows(tmp_path / "reference")


def test_fixed_work_is_the_module_s_own_phases():
    cfg = ClientConfig(2, 4, "sgd", 0.1, 0.0, 0.0)
    assert not cfg.varies and cfg.budget(cfg.work(0, 1, 0), 10) is None
