"""Learning-rate schedules across rounds in whole runs: every round's lrs in the metrics, a run
stopped after round 1 and resumed equal to an uninterrupted one, and the cosine schedules (over
the run's total) refused when a run would be extended."""

from __future__ import annotations

import pytest

from fedexp.config.extend import check_extension
from fedexp.core.types import ConfigError

SHORT = ("rounds=3", "eval_every=1", "checkpoint_every=0")
SCHEDULED = {
    # client: lr·0.5^(t−1); FedAvgM's server: 1.0·0.5^floor((t−1)/2)
    "exponential": (
        "client.lr_schedule=exponential", "client.lr_decay=0.5", "algorithm.server_momentum=0.5",
        "algorithm.server_lr_schedule=step", "algorithm.server_lr_decay=0.5",
        "algorithm.server_lr_step_rounds=2",
    ),
    # client: cosine over the 3 rounds to lr/10; server: warm-up over 2 rounds
    "cosine": (
        "client.lr_schedule=cosine", "client.lr_min=0.005", "algorithm.server_lr_schedule=warmup",
        "algorithm.server_lr_warmup_rounds=2",
    ),
}  # fmt: skip


@pytest.mark.parametrize("schedule", sorted(SCHEDULED))
def test_scheduled_run_stopped_and_resumed_equals_an_uninterrupted_one(
    compose_cfg, lifecycle, tmp_path, schedule
):
    cfg = compose_cfg(*SHORT, "algorithm=fedavg", "client.lr=0.05", *SCHEDULED[schedule])
    ref = lifecycle.run(cfg, tmp_path / "reference")
    rows = lifecycle.rows(tmp_path / "reference")
    lrs = [(r["train/client_lr"], r["train/server_lr"]) for r in rows]
    if schedule == "exponential":
        assert lrs == [(0.05, 1.0), (0.025, 1.0), (0.0125, 0.5)]
    else:  # 0.005 + 0.045·(1 + cos(π(t−1)/3))/2; server 1·t/2 up to round 2
        assert [c for c, _ in lrs] == pytest.approx([0.05, 0.03875, 0.01625], abs=1e-15)
        assert [s for _, s in lrs] == [0.5, 1.0, 1.0]
    run_dir = tmp_path / "stopped"
    stopped = lifecycle.run(cfg, run_dir, callbacks=[lifecycle.SignalAfter(1)])
    assert stopped["status"] == "interrupted" and stopped["rounds_completed"] == 1
    resumed = lifecycle.run(cfg, run_dir, resume=True)
    assert resumed["status"] == "completed" and resumed["resumed_from_round"] == 1
    assert lifecycle.final(resumed) == lifecycle.final(ref)
    assert lifecycle.rows(run_dir) == rows


def test_constant_reports_the_plain_lrs_every_round(compose_cfg, lifecycle, tmp_path):
    lifecycle.run(compose_cfg(*SHORT, "algorithm=fedavg", "client.lr=0.05"), tmp_path / "run")
    rows = lifecycle.rows(tmp_path / "run")
    assert [(r["train/client_lr"], r["train/server_lr"]) for r in rows] == [(0.05, 1.0)] * 3


@pytest.mark.parametrize(
    ("overrides", "changed"),
    [
        (("client.lr_schedule=cosine",), "client.lr_schedule=cosine"),
        (
            ("algorithm=fedavg", "algorithm.server_lr_schedule=cosine"),
            "algorithm.server_lr_schedule=cosine",
        ),
        (
            ("algorithm=fedopt", "algorithm.server_lr_schedule=cosine"),
            "algorithm.server_lr_schedule=cosine",
        ),
    ],
)
def test_a_cosine_run_cannot_be_extended(compose_cfg, overrides, changed):
    cfg = compose_cfg("rounds=4", *overrides)
    check_extension(cfg, 4)  # a plain resume
    with pytest.raises(ConfigError, match=f"from 2 to 4 rounds changes {changed}: start a new"):
        check_extension(cfg, 2)
    # the schedules counted from the first round extend
    check_extension(compose_cfg("rounds=4", "client.lr_schedule=exponential"), 2)
