"""One writer per run dir: a second writer is refused while a run holds its dir, a fresh run never
lands on finished results, and a sweep survives a job whose config is refused."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import main_in_process
from fedexp.runtime.run_dir import LOCK_FILE, claim, discard

HOLD_LOCK = (
    "import fcntl, os, sys, time\n"
    "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)\n"
    "fcntl.flock(fd, fcntl.LOCK_EX)\n"
    "os.write(fd, str(os.getpid()).encode())\n"
    "print('locked', flush=True)\n"
    "time.sleep(120)\n"
)


def hold_lock(run_dir: Path) -> subprocess.Popen:
    """Another process holding the run dir's lock, as a running fedexp does."""
    run_dir.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(run_dir / LOCK_FILE)], stdout=subprocess.PIPE
    )
    assert proc.stdout.readline().strip() == b"locked"
    return proc


def cli(tmp_path, monkeypatch, capsys, *args: str) -> tuple[int, str]:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FEDEXP_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("FEDEXP_DATA_DIR", str(tmp_path / "data"))
    return main_in_process(monkeypatch, capsys, *args)


def snapshot(run_dir: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(run_dir)): p.read_bytes()
        for p in sorted(run_dir.rglob("*"))
        if p.is_file() and p.name != LOCK_FILE
    }


def one_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("fedexp: error: "), err
    return lines[0]


@pytest.mark.experiment
def test_a_fresh_run_into_a_dir_with_results_is_refused_and_changes_nothing(
    tmp_path, monkeypatch, capsys
):
    code, err = cli(tmp_path, monkeypatch, capsys, "debug=smoke", "hydra.run.dir=run")
    assert code == 0, err
    before = snapshot(tmp_path / "run")
    assert {"metrics.jsonl", "summary.json", ".hydra/config.yaml"} <= set(before)
    # the same dir for another config: once rows 1,2,1,2,3 and the first summary overwritten
    code, err = cli(tmp_path, monkeypatch, capsys, "debug=smoke", "rounds=3", "hydra.run.dir=run")
    assert code == 2
    assert "already holds the results of a run (metrics.jsonl, summary.json)" in one_line(err)
    assert snapshot(tmp_path / "run") == before  # .hydra/ and the log included


@pytest.mark.cli
@pytest.mark.experiment
def test_a_fresh_run_is_refused_while_another_process_holds_the_dir(tmp_path, monkeypatch, capsys):
    holder = hold_lock(tmp_path / "run")
    try:
        code, err = cli(tmp_path, monkeypatch, capsys, "debug=smoke", "hydra.run.dir=run")
    finally:
        holder.kill()
        holder.wait()
    assert code == 2
    assert f"is being written by another fedexp process (pid {holder.pid})" in one_line(err)
    assert [p.name for p in (tmp_path / "run").iterdir()] == [LOCK_FILE]  # no .hydra written


@pytest.mark.cli
def test_a_resume_is_refused_while_the_run_is_still_going(
    compose_cfg, lifecycle, tmp_path, monkeypatch, capsys
):
    from omegaconf import OmegaConf

    cfg = compose_cfg("rounds=3", "eval_every=1", "checkpoint_every=1")
    run_dir = tmp_path / "run"
    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / ".hydra" / "config.yaml").write_text(OmegaConf.to_yaml(cfg))
    lifecycle.run(cfg, run_dir, callbacks=[lifecycle.SignalAfter(1)])
    before = snapshot(run_dir)
    holder = hold_lock(run_dir)
    try:
        code, err = main_in_process(monkeypatch, capsys, f"resume={run_dir}")
    finally:
        holder.kill()
        holder.wait()
    assert code == 2 and "resume: " in one_line(err) and "another fedexp process" in err
    assert snapshot(run_dir) == before
    code, err = main_in_process(monkeypatch, capsys, f"resume={run_dir}")  # lock gone with it
    assert code == 0, err
    assert [r["round"] for r in lifecycle.rows(run_dir)] == [1, 2, 3]


@pytest.mark.cli
def test_the_os_releases_the_lock_when_its_holder_is_killed(tmp_path):
    holder = hold_lock(tmp_path / "run")
    holder.send_signal(signal.SIGKILL)
    assert holder.wait() == -signal.SIGKILL
    claimed = claim(tmp_path / "run", fresh=True)  # a ConfigError while the lock is held
    try:
        assert claimed == (tmp_path / "run").resolve()
        # the lock file names this process, and the lock is now this process's
        assert (claimed / LOCK_FILE).read_text() == f"{os.getpid()}\n"
        fd = os.open(claimed / LOCK_FILE, os.O_RDWR)
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)
    finally:
        discard(claimed)


@pytest.mark.experiment
def test_a_refused_config_in_an_existing_dir_removes_only_what_it_wrote(
    tmp_path, monkeypatch, capsys
):
    run_dir = tmp_path / "mine"
    run_dir.mkdir()
    (run_dir / "notes.txt").write_text("kept")
    code, err = cli(tmp_path, monkeypatch, capsys, "debug=smoke", "seed=-1", "hydra.run.dir=mine")
    assert code == 2 and "seed: must be >= 0" in one_line(err)
    assert sorted(p.name for p in run_dir.iterdir()) == [LOCK_FILE, "notes.txt"]


# ---- sweeps -------------------------------------------------------------------------------------
def summary(job_dir: Path) -> dict:
    return json.loads((job_dir / "summary.json").read_text())


@pytest.mark.experiment
def test_a_sweep_runs_every_job_whose_config_is_good(tmp_path, monkeypatch, capsys):
    args = ("-m", "debug=smoke", "rounds=1", "client.lr=0.05,-1,0.1", "hydra.sweep.dir=sweep")
    code, err = cli(tmp_path, monkeypatch, capsys, *args)
    assert code == 2  # a job's config was refused
    jobs = [summary(tmp_path / "sweep" / j) for j in "012"]
    assert [s["status"] for s in jobs] == ["completed", "config_error", "completed"]
    assert jobs[1]["error"] == "client.lr: must be > 0, got -1"
    assert [s["config"]["client"]["lr"] for s in jobs] == [0.05, -1, 0.1]
    assert "fedexp: error: client.lr: must be > 0, got -1" in err
    # the same sweep again continues it: every job finished (the refused one too), none runs
    before = snapshot(tmp_path / "sweep")
    code, err = cli(tmp_path, monkeypatch, capsys, *args)
    assert code == 2 and err == ""
    assert snapshot(tmp_path / "sweep") == before
    # another sweep into the same dir: refused in one line naming the difference, nothing written
    other = ("-m", "debug=smoke", "rounds=1", "client.lr=0.05,0.1", "hydra.sweep.dir=sweep")
    code, err = cli(tmp_path, monkeypatch, capsys, *other)
    assert (
        code == 2
        and "holds another sweep (it ran client.lr=0.05,-1,0.1; now client.lr=0.05,0.1)"
        in one_line(err)
    )
    assert snapshot(tmp_path / "sweep") == before


@pytest.mark.experiment
def test_a_sweep_whose_first_job_is_refused_runs_the_next(tmp_path, monkeypatch, capsys):
    args = ("-m", "debug=smoke", "rounds=1", "attack=none,scaling", "attack.fraction=0.2")
    code, _ = cli(tmp_path, monkeypatch, capsys, *args, "hydra.sweep.dir=sweep")
    assert code == 2
    jobs = [summary(tmp_path / "sweep" / j) for j in "01"]
    assert [s["status"] for s in jobs] == ["config_error", "completed"]
    assert jobs[0]["error"].startswith("attack.fraction: 0.2 with attack=none")


@pytest.mark.experiment
def test_sweep_jobs_spill_client_state_to_dirs_of_their_own_removed_at_the_end(
    tmp_path, monkeypatch, capsys
):
    from omegaconf import OmegaConf

    from fedexp.__main__ import own_spill_dir

    spill = tmp_path / "spill"
    cfgs = [OmegaConf.create({"client_store": {"spill_dir": str(spill)}}) for _ in range(2)]
    own = [own_spill_dir(c, tmp_path / "sweep" / j) for c, j in zip(cfgs, "01")]
    assert own[0] != own[1] and all(p.parent == spill for p in own)
    assert [c.client_store.spill_dir for c in cfgs] == [str(p) for p in own]
    args = ("-m", "debug=smoke", "algorithm=fedrep", "seed=0,1", "client_store.max_bytes=1")
    code, err = cli(tmp_path, monkeypatch, capsys, *args, f"client_store.spill_dir={spill}")
    assert code == 0, err
    assert list(spill.iterdir()) == []  # every job's spill dir removed when it ended
    spilled_to = [summary(d)["config"]["client_store"]["spill_dir"] for d in run_dirs(tmp_path)]
    assert len(set(spilled_to)) == 2


def run_dirs(root: Path) -> list[Path]:
    return sorted(p.parent for p in root.rglob("summary.json"))


@pytest.mark.cli
@pytest.mark.slow
def test_parallel_jobs_survive_a_refused_job_and_a_live_run_keeps_its_dir(tmp_path):
    """Through real processes: joblib jobs, and a second writer while a run is going."""
    env = dict(os.environ, FEDEXP_CACHE_DIR=str(tmp_path / "c"), OMP_NUM_THREADS="1")
    tests = Path(__file__).resolve().parents[1]
    env["PYTHONPATH"] = os.pathsep.join([str(tests.parent / "src"), str(tests)])
    fedexp = [sys.executable, "-m", "fedexp", "debug=smoke"]
    run = dict(cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    sweep = ["hydra/launcher=parallel", "client.lr=0.05,-1", "hydra.sweep.dir=sweep"]
    proc = subprocess.run([*fedexp[:3], "-m", *fedexp[3:], "rounds=1", *sweep], **run)
    assert proc.returncode == 2, proc.stderr
    assert [summary(tmp_path / "sweep" / j)["status"] for j in "01"] == [
        "completed",
        "config_error",
    ]
    slow = ["attack._target_=slow_attack.SleepEachRound", "+attack.seconds=2"]
    live = subprocess.Popen(
        [*fedexp, "rounds=40", "eval_every=1", "checkpoint_every=1", *slow, "hydra.run.dir=live"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    log = tmp_path / "live" / "metrics.jsonl"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not (log.exists() and log.read_text().count("\n")):
        time.sleep(0.05)
    config = (tmp_path / "live" / ".hydra" / "config.yaml").read_text()
    pipes = dict(cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    others = [
        subprocess.Popen([*fedexp, "rounds=2", "hydra.run.dir=live"], **pipes),
        subprocess.Popen([sys.executable, "-m", "fedexp", "resume=live"], **pipes),
    ]
    errors = [p.communicate(timeout=600)[1] for p in others]
    assert live.poll() is None, "the live run ended before the second writers were refused"
    assert [p.returncode for p in others] == [2, 2], errors
    assert all("another fedexp process" in err for err in errors), errors
    assert live.wait(timeout=600) == 0
    rounds = [json.loads(line)["round"] for line in log.read_text().splitlines()]
    assert rounds == list(range(1, 41))  # every round once: no interleaved writer
    assert (tmp_path / "live" / ".hydra" / "config.yaml").read_text() == config
