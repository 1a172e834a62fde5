"""Clients that come and go in whole runs: dropout's per-round counts, the same clients on every
executor, a round nobody returns from, exact resume, and one-line refusals before training."""

from __future__ import annotations

import pytest

from fedexp.config.values import check_config_values
from fedexp.errors import ConfigError
from fedexp.run import Experiment

pytestmark = pytest.mark.experiment
SHORT = ("rounds=3", "eval_every=1", "checkpoint_every=0")


class Recorder:
    """An executor that remembers which clients each round trained."""

    def __init__(self, inner):
        self.inner, self.trained = inner, []

    def run(self, algorithm, payloads, ctx, data, stats=None):
        self.trained.append((ctx.round, tuple(ctx.client_ids)))
        return self.inner.run(algorithm, payloads, ctx, data, stats)


def recorded_run(cfg, run_dir):
    run_dir.mkdir(parents=True)
    exp = Experiment(cfg, run_dir)
    exp.components.executor = recorder = Recorder(exp.executor)
    return exp.run().to_dict(), recorder.trained


def test_dropout_counts_per_round(compose_cfg, lifecycle, tmp_path):
    # smoke: 3 of 6 clients a round; dropout 0.3 drops round(0.9) = 1 of them
    cfg = compose_cfg(*SHORT, "dropout=0.3")
    summary, trained = recorded_run(cfg, tmp_path / "run")
    rows = lifecycle.rows(tmp_path / "run")
    for row in rows:
        assert (row["clients/sampled"], row["clients/returned"], row["clients/dropped"]) == (
            3,
            2,
            1,
        )
        assert "clients/available" not in row
    assert [len(ids) for _, ids in trained] == [2, 2, 2]  # the dropped ones never train
    assert summary["status"] == "completed" and not summary["warnings"]


def test_every_executor_trains_the_same_clients(compose_cfg, lifecycle, tmp_path):
    runs = {}
    for name in ("sequential", "vectorized"):
        cfg = compose_cfg(*SHORT, "dropout=0.5", "sampling=size", f"executor={name}")
        runs[name] = recorded_run(cfg, tmp_path / name)
    assert runs["sequential"][1] == runs["vectorized"][1]
    seq, vec = (lifecycle.rows(tmp_path / n) for n in ("sequential", "vectorized"))
    for a, b in zip(seq, vec):
        assert {k: v for k, v in a.items() if k.startswith("clients/")} == {
            k: v for k, v in b.items() if k.startswith("clients/")
        }
        assert a["train/loss"] == pytest.approx(b["train/loss"], rel=1e-4)


def test_a_round_nobody_returns_from_leaves_the_server_state(compose_cfg, lifecycle, tmp_path):
    # round 1: clients 0-3 available, 3 sampled, round(1.5) = 2 drop; round 2: only client 5,
    # who drops (round(0.5) = 1): nobody returns; round 3 reads the trace's round 1 again
    trace = tmp_path / "trace.csv"
    trace.write_text("client_id,1,2\n0,1,0\n1,1,0\n2,1,0\n3,1,0\n5,0,1\n")
    cfg = compose_cfg(*SHORT, "dropout=0.5", f"availability={trace}")
    summary, trained = recorded_run(cfg, tmp_path / "run")
    rows = lifecycle.rows(tmp_path / "run")
    assert [r["clients/available"] for r in rows] == [4, 1, 4]
    assert [r["clients/returned"] for r in rows] == [1, 0, 1]
    assert [r for r, _ in trained] == [1, 3]  # round 2 trained nobody
    empty = rows[1]
    assert "train/loss" not in empty and empty["comm/up_bits"] == 0
    assert empty["clients/sampled"] == 1 and empty["clients/dropped"] == 1
    # the state stayed: the evaluation of round 2 is round 1's
    for key in ("eval/global/acc", "eval/global/loss", "eval/val/global/acc"):
        assert empty[key] == rows[0][key]
    assert summary["status"] == "completed"
    assert any("1 of 3 rounds had no client return an update" in w for w in summary["warnings"])


def test_a_resumed_dropout_run_ends_as_an_uninterrupted_one(compose_cfg, lifecycle, tmp_path):
    cfg = compose_cfg(*SHORT, "dropout=0.5", "sampling=size")
    ref = lifecycle.run(cfg, tmp_path / "reference")
    run_dir = tmp_path / "stopped"
    stopped = lifecycle.run(cfg, run_dir, callbacks=[lifecycle.SignalAfter(1)])
    assert stopped["status"] == "interrupted" and stopped["rounds_completed"] == 1
    resumed = lifecycle.run(cfg, run_dir, resume=True)
    assert resumed["status"] == "completed" and resumed["resumed_from_round"] == 1
    assert lifecycle.final(resumed) == lifecycle.final(ref)
    assert lifecycle.rows(run_dir) == lifecycle.rows(tmp_path / "reference")


@pytest.mark.parametrize(
    ("override", "says"),
    [
        ("sampling=random", "sampling: must be uniform or size, got 'random'"),
        ("dropout=1.0", "dropout: must be a fraction in [0, 1), got 1.0"),
        ("dropout=-0.1", "dropout: must be a fraction in [0, 1), got -0.1"),
        ("dropout=true", "dropout: must be a fraction in [0, 1), got True"),
        (
            "availability=/nonexistent/trace.csv",
            "availability: /nonexistent/trace.csv: no such file",
        ),
    ],
)
def test_bad_values_are_one_line_before_anything_is_built(compose_cfg, override, says):
    with pytest.raises(ConfigError) as err:
        check_config_values(compose_cfg(override))
    assert str(err.value) == says


def test_dp_fedavg_refuses_a_sampling_its_accountant_does_not_assume(compose_cfg, tmp_path):
    cfg = compose_cfg("algorithm=dp_fedavg", "sampling=size")
    with pytest.raises(ConfigError, match="^sampling: dp_fedavg's accountant assumes"):
        Experiment(cfg, tmp_path)


def test_a_malformed_trace_exits_2_in_one_line(monkeypatch, capsys, tmp_path):
    from conftest import main_in_process

    trace = tmp_path / "trace.csv"
    trace.write_text("client_id,round,available\n0,1,yes\n")
    code, err = main_in_process(
        monkeypatch,
        capsys,
        "debug=smoke",
        f"availability={trace}",
        f"hydra.run.dir={tmp_path / 'r'}",
    )
    assert code == 2
    assert err.strip().splitlines() == [
        f"fedexp: error: availability: {trace} line 2: available must be 0 or 1, got 'yes'"
    ]


def test_a_run_dir_saved_before_the_options_existed_resumes(compose_cfg, lifecycle, tmp_path):
    from omegaconf import open_dict

    cfg = compose_cfg(*SHORT)
    ref = lifecycle.run(cfg, tmp_path / "reference")
    old = cfg.copy()
    with open_dict(old):
        for key in ("sampling", "dropout", "availability"):
            del old[key]
    run_dir = tmp_path / "stopped"
    lifecycle.run(old, run_dir, callbacks=[lifecycle.SignalAfter(1)])
    resumed = lifecycle.run(old, run_dir, resume=True)
    assert resumed["status"] == "completed"
    assert lifecycle.final(resumed) == lifecycle.final(ref)


@pytest.mark.parametrize(
    ("aggregator", "says"),
    [
        (
            ("aggregator=trimmed_mean", "aggregator.beta=1"),
            "2 of 3 rounds returned fewer than 3 updates (dropout, availability): "
            "aggregator.beta=1 trims less (2 beta + 1 = 3) in them",
        ),
        (
            ("aggregator=multikrum", "aggregator.f=1", "clients_per_round=5"),
            "2 of 3 rounds returned fewer than 5 updates (dropout, availability): "
            "aggregator.f=1 was capped (Multi-Krum needs n >= 5) in them",
        ),
        (("aggregator=trimmed_mean", "aggregator.beta=0.2"), None),  # scales with the round
    ],
    ids=["trimmed_mean", "multikrum", "fraction"],
)
def test_a_robust_count_sized_for_a_full_round_warns_of_smaller_rounds(
    compose_cfg, lifecycle, tmp_path, aggregator, says
):
    # round 1: 2 clients available, fewer than 2 beta + 1 = 3 or Multi-Krum's 2f + 3 = 5;
    # round 2: all 6 (the cohort of 4, or 5); round 3 replays round 1
    trace = tmp_path / "trace.csv"
    trace.write_text("client_id,1,2\n0,1,1\n1,1,1\n2,0,1\n3,0,1\n4,0,1\n5,0,1\n")
    cfg = compose_cfg(*SHORT, f"availability={trace}", "clients_per_round=4", *aggregator)
    summary = lifecycle.run(cfg, tmp_path / "run")
    assert [r["clients/returned"] for r in lifecycle.rows(tmp_path / "run")][:2] == [
        2,
        cfg.clients_per_round,
    ]
    short = [w for w in summary["warnings"] if "returned fewer than" in w]
    assert short == ([says] if says else [])
