"""A sweep that continues: the same multirun command with the same hydra.sweep.dir after a
SIGKILL keeps the finished jobs untouched, resumes the interrupted one from its checkpoint and
runs the rest; every job ends as in a sweep that was never stopped. A SIGTERM'd sweep names the
command that continues it; another sweep into the same dir is refused."""

from __future__ import annotations

import os
import shlex
from pathlib import Path

import pytest

from conftest import REPO, TESTS, final_metrics, metric_rows, run_cli, summaries
from fedexp.runtime.run_dir import LOCK_FILE

SWEEP = ("debug=smoke", "checkpoint_every=1", "seed=0,1,2,3")
JOBS = "0123"
PATH = {"PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(TESTS)])}


def kill_at(job: int, signal: str = "SIGKILL") -> tuple[str, ...]:
    """A test callback that signals the sweep's process group at job `job`'s first checkpoint."""
    return (
        "+hydra.callbacks.kill._target_=sweep_kill.KillAt",
        f"+hydra.callbacks.kill.job={job}",
        f"+hydra.callbacks.kill.signal={signal}",
    )


def sweep(cwd: Path, *args: str, check: bool = True, env=None):
    return run_cli(*SWEEP, *args, cwd=cwd, multirun=True, check=check, env={**PATH, **(env or {})})


def files(job_dir: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(job_dir)): p.read_bytes()
        for p in sorted(job_dir.rglob("*"))
        if p.is_file() and p.name != LOCK_FILE
    }


def job_result(job_dir: Path) -> tuple[dict, list[dict]]:
    (summary,) = summaries(job_dir)
    assert summary["status"] == "completed", summary
    return final_metrics(summary), metric_rows(job_dir)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> dict[str, tuple]:
    """Every job's (final metrics, metric rows) of the sweep run without a stop."""
    cwd = tmp_path_factory.mktemp("uninterrupted")
    sweep(cwd, "hydra.sweep.dir=sweep")
    return {j: job_result(cwd / "sweep" / j) for j in JOBS}


@pytest.mark.experiment
@pytest.mark.parametrize("launcher", ["basic", pytest.param("joblib", marks=pytest.mark.slow)])
def test_a_killed_sweep_run_again_continues_where_it_stopped(tmp_path, uninterrupted, launcher):
    parallel = ("hydra/launcher=joblib", "hydra.launcher.n_jobs=2") if launcher == "joblib" else ()
    env = {"OMP_NUM_THREADS": "1"}
    args = (*parallel, "hydra.sweep.dir=sweep")
    killed = sweep(tmp_path, *args, *kill_at(2), check=False, env=env)
    assert killed.returncode == -9, killed.stderr[-2000:]
    jobs = tmp_path / "sweep"
    assert (jobs / "2" / "checkpoint.pt").exists() and not (jobs / "2" / "summary.json").exists()
    finished = {j: files(jobs / j) for j in JOBS if (jobs / j / "summary.json").exists()}
    assert {"0", "1"} <= set(finished)  # the jobs before the killed one
    proc = sweep(tmp_path, *args, env=env)  # the same command again
    assert {j: files(jobs / j) for j in finished} == finished  # kept as they were
    assert {j: job_result(jobs / j) for j in JOBS} == uninterrupted
    assert "sweep sweep: 4 runs in 1 group" in proc.stdout


def stopped_sweep_command(tmp_path: Path) -> list[str]:
    """A sweep SIGTERM'd at job 1: its one line naming the command that continues it, checked,
    and that command's arguments after `python -m fedexp -m`, the test's callback left out."""
    stopped = sweep(tmp_path, "hydra.sweep.dir=sweep", *kill_at(1, "SIGTERM"), check=False)
    assert stopped.returncode == 128 + 15, stopped.stderr[-2000:]
    lines = [line for line in stopped.stderr.splitlines() if "continue" in line]
    assert len(lines) == 1, stopped.stderr[-3000:]
    head, _, command = lines[0].partition("; continue it with: ")
    assert head == "fedexp: SIGTERM: the sweep stopped"
    args = shlex.split(command)
    assert args[:4] == ["python", "-m", "fedexp", "-m"]
    assert f"hydra.sweep.dir={tmp_path / 'sweep'}" in args
    return [a for a in args[4:] if not a.startswith("+hydra.callbacks.kill")]


@pytest.mark.experiment
def test_a_stopped_sweep_names_the_command_that_continues_it(tmp_path):
    stopped_sweep_command(tmp_path)


@pytest.mark.slow
def test_the_command_a_stopped_sweep_names_continues_it(tmp_path, uninterrupted):
    # the command as printed (minus the test's callback) continues the sweep
    proc = run_cli(*stopped_sweep_command(tmp_path), cwd=tmp_path, multirun=True, env=PATH)
    assert {j: job_result(tmp_path / "sweep" / j) for j in JOBS} == uninterrupted
    assert "4 runs in 1 group" in " ".join(proc.stdout.split())  # the title wraps on long paths


@pytest.mark.experiment
@pytest.mark.parametrize(
    "changed, named",
    [
        (("debug=smoke", "checkpoint_every=1", "seed=0,1"), "it ran seed=0,1,2,3; now seed=0,1"),
        (("checkpoint_every=1", "debug=smoke", "seed=0,1,2,3"), "in another order"),
        (("debug=smoke", "checkpoint_every=1", "seed=0,1,2,3", "rounds=3"), "now rounds=3"),
    ],
)
def test_another_sweep_into_the_dir_is_refused_and_writes_nothing(tmp_path, changed, named):
    jobs = tmp_path / "sweep"
    jobs.mkdir()
    (jobs / "multirun.yaml").write_text(
        "hydra:\n  overrides:\n    task: ['debug=smoke', 'checkpoint_every=1', 'seed=0,1,2,3']\n"
        "  sweeper:\n    _target_: hydra._internal.core_plugins.basic_sweeper.BasicSweeper\n"
    )
    before = files(jobs)
    proc = run_cli(*changed, "hydra.sweep.dir=sweep", cwd=tmp_path, multirun=True, check=False)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"fedexp: error: hydra.sweep.dir: {jobs} holds another sweep")
    assert named in lines[0]
    assert files(jobs) == before and sorted(p.name for p in jobs.iterdir()) == [
        LOCK_FILE,
        "multirun.yaml",
    ]
