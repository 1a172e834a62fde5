"""Bulyan, centered clipping, the geometric median and FLTrust in whole runs: through the CLI with
and without an attack, refused settings (exit 2), an exact resume of the state they keep, and
FLTrust on the vectorized executor. Whole runs: the slow tier (make test-full)."""

from __future__ import annotations

import pytest

from conftest import summaries

NEW = "bulyan,centered_clip,geometric_median,fltrust"
# a round of 11 uploads: Bulyan's n >= 4f + 3 holds for the 2 malicious clients of 12
ROUNDS = ("debug=smoke", "num_clients=12", "clients_per_round=11", "logger={}")


@pytest.mark.slow
def test_each_runs_from_the_cli_clean_and_under_sign_flip(cli):
    cli(*ROUNDS, f"aggregator={NEW}", multirun=True)
    cli(*ROUNDS, f"aggregator={NEW}", "attack=sign_flip", "attack.fraction=0.2", multirun=True)
    runs = summaries(cli.cwd)
    assert [r["status"] for r in runs] == ["completed"] * 8
    assert sorted(r["choices"]["aggregator"] for r in runs) == sorted(NEW.split(",") * 2)
    for run in runs:
        pool = run["metrics"].get("data/server_pool", 0)
        # auto: FLTrust's root dataset (100, capped at 16 by debug=smoke), nobody else a pool
        assert pool == (16 if run["choices"]["aggregator"] == "fltrust" else 0), run["choices"]
        assert 0 <= run["metrics"]["eval/global/acc"] <= 1


@pytest.mark.slow
@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        (
            ("aggregator=fltrust", "partition.server_pool=0"),
            "aggregator: fltrust trains the server's update on the server pool, but "
            "partition.server_pool=0; set partition.server_pool=100",
        ),
        (
            ("aggregator=bulyan", "aggregator.f=1"),
            "aggregator.f: 1 means 1 malicious of the 3 uploads of a round (clients_per_round=3); "
            "Bulyan needs clients_per_round >= 4f + 3 = 7",
        ),
        (("aggregator=centered_clip", "aggregator.iterations=0"), "aggregator.iterations: must"),
        (("aggregator=geometric_median", "aggregator.nu=0"), "aggregator.nu: must be a number"),
        (
            ("aggregator=fltrust", "algorithm=fedproto"),
            "aggregator: fltrust needs the server's own update of each round, which FedProto "
            "does not give it",
        ),
    ],
    ids=["fltrust-pool", "bulyan-f", "cc-iterations", "gm-nu", "fltrust-fedproto"],
)
def test_refused_before_training_in_one_line(cli_in_process, overrides, says):
    proc = cli_in_process("debug=smoke", *overrides, check=False)
    assert proc.returncode == 2, proc.stderr
    error = [line for line in proc.stderr.splitlines() if line.startswith("fedexp: error:")]
    assert len(error) == 1 and says in error[0], proc.stderr


@pytest.mark.experiment
def test_a_capped_aggregation_is_counted_beside_the_numbers(compose_cfg, lifecycle, tmp_path):
    # 3 uploads a round, 1 malicious client of 3: Bulyan (f = known) needs n >= 4f + 3 = 7 in
    # every round (all 3 clients train each round), and falls back to f = 0
    cfg = compose_cfg(
        "aggregator=bulyan", "attack=sign_flip", "attack.fraction=0.34", "num_clients=3"
    )
    summary = lifecycle.run(cfg, tmp_path / "run")
    (line,) = [w for w in summary["warnings"] if "more than Bulyan allows" in w]
    assert line.startswith("aggregator.f: 1 of 3 uploads is more than Bulyan allows")
    assert "(the first of 2 aggregations so)" in line  # both rounds (smoke: 2 rounds)


@pytest.mark.slow
@pytest.mark.parametrize("aggregator", ["centered_clip", "fltrust"])
def test_a_resumed_run_ends_as_an_uninterrupted_one(compose_cfg, lifecycle, tmp_path, aggregator):
    # centered clipping starts each round from the previous aggregate (a server-state buffer,
    # checkpointed); FLTrust trains the server on streams of (seed, round)
    clips = ("aggregator.tau=0.05",) if aggregator == "centered_clip" else ()  # v matters
    cfg = compose_cfg("rounds=3", f"aggregator={aggregator}", *clips)
    ref = lifecycle.run(cfg, tmp_path / "reference")
    run_dir = tmp_path / "stopped"
    stopped = lifecycle.run(cfg, run_dir, callbacks=[lifecycle.SignalAfter(1)])
    assert stopped["status"] == "interrupted" and stopped["rounds_completed"] == 1
    resumed = lifecycle.run(cfg, run_dir, resume=True)
    assert resumed["status"] == "completed" and resumed["resumed_from_round"] == 1
    assert lifecycle.final(resumed) == lifecycle.final(ref)
    assert lifecycle.rows(run_dir) == lifecycle.rows(tmp_path / "reference")


@pytest.mark.slow
def test_fltrust_on_the_vectorized_executor_matches_the_sequential_one(compose_cfg, lifecycle,
                                                                       tmp_path):  # fmt: skip
    runs = {}
    for executor in ("sequential", "vectorized"):
        cfg = compose_cfg("aggregator=fltrust", f"executor={executor}")
        runs[executor] = lifecycle.run(cfg, tmp_path / executor)
    seq, vec = (lifecycle.final(runs[e]) for e in ("sequential", "vectorized"))
    assert runs["vectorized"]["status"] == "completed"
    assert vec["train/loss"] == pytest.approx(seq["train/loss"], rel=1e-4)
    assert vec["eval/global/loss"] == pytest.approx(seq["eval/global/loss"], rel=1e-4)
