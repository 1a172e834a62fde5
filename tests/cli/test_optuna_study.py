"""hydra/sweeper=optuna_study: the study persists in <sweep dir>/optuna.db, a killed search resumes,
and the pruner stops a trial on its per-round validation objective."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
from optuna.trial import TrialState

from conftest import REPO, run_cli

SEARCH = ("hparams_search=fedprox_mu", "debug=smoke", "hydra.sweep.dir=search")


def study(cwd: Path) -> optuna.Study:
    return optuna.load_study(study_name="fedprox_mu", storage=f"sqlite:///{cwd}/search/optuna.db")


def test_a_clearly_bad_trial_is_pruned_after_its_first_round(cli_in_process):
    # learning rate 1e-9: the model barely moves from its initial ~chance accuracy, far below 0.9
    tmp_path = cli_in_process.cwd
    cli_in_process(
        *SEARCH,
        "rounds=2",  # pruned: 1 round of 2
        "hydra.sweeper.n_trials=1",
        "client.lr=choice(1e-9)",
        "algorithm.mu=choice(0.01)",
        "~hydra.sweeper.pruner.n_startup_trials",
        "~hydra.sweeper.pruner.n_warmup_steps",
        "hydra.sweeper.pruner._target_=optuna.pruners.ThresholdPruner",
        "+hydra.sweeper.pruner.lower=0.9",
    )
    (trial,) = study(tmp_path).trials
    assert trial.state == TrialState.PRUNED
    assert trial.user_attrs["pruned_round"] == 1 and list(trial.intermediate_values) == [1]
    summary = json.loads((tmp_path / "search" / "0" / "summary.json").read_text())
    assert summary["status"] == "pruned" and summary["rounds_completed"] == 1


def test_a_killed_search_resumes_from_its_study(tmp_path):
    args = [*SEARCH, "hydra.sweeper.n_trials=3", "hydra.sweeper.pruner=null"]
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"), WANDB_MODE="offline")
    env.update(FEDEXP_CACHE_DIR=str(tmp_path / "cache"), OMP_NUM_THREADS="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "fedexp", *args],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:  # kill the search once trial 1 has started (trial 0 is done)
        deadline = time.monotonic() + 300
        while not (tmp_path / "search" / "1" / ".hydra").exists():
            assert proc.poll() is None and time.monotonic() < deadline, "trial 1 never started"
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
    first = study(tmp_path).trials
    assert [t.state for t in first] == [TrialState.COMPLETE, TrialState.RUNNING]

    resumed = run_cli(*args, cwd=tmp_path)  # the same command and sweep dir continue the study
    both = resumed.stdout + resumed.stderr  # no set-up chatter; the sweep's table and report
    assert "alembic" not in both and "A new study created" not in both
    assert "3 runs in 3 groups, differing in" in resumed.stdout
    assert (tmp_path / "search" / "report" / "report.md").exists()
    trials = study(tmp_path).trials
    assert trials[0].value == first[0].value and trials[0].params == first[0].params
    assert trials[1].state == TrialState.FAIL and trials[1].user_attrs["interrupted"]
    # the interrupted parameters run again, then one new trial: 3 finished trials in all
    assert trials[2].params == first[1].params
    assert [t.state for t in trials[2:]] == [TrialState.COMPLETE, TrialState.COMPLETE]
    # the new trial is a new point, not the first proposal of a sampler seeded as before
    assert len({tuple(sorted(trials[i].params.items())) for i in (0, 2, 3)}) == 3
    assert sorted(p.parent.name for p in (tmp_path / "search").glob("*/summary.json")) == [
        "0",
        "2",
        "3",
    ]
