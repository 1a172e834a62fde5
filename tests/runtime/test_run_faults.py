"""File-system faults and stop signals end in one line naming the path and the cause (and how to
resume, where a checkpoint exists), never in a traceback: a run dir that cannot be written, a
full disk at the start or mid-run, a run dir removed mid-run, a second SIGTERM, a sweep job that
raises. Faults are simulated: an `os` call or a writer raising OSError with the errno."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest
import torch

import faults
from faults import cli, one_line
from fedexp.errors import ConfigError
from fedexp.runtime import run_dir as rundir
from fedexp.runtime.checkpoint import CHECKPOINT_FILE

SMOKE = ("debug=smoke", "rounds=3", "eval_every=1", "checkpoint_every=1")


def test_a_run_dir_that_cannot_be_written_is_refused_in_one_line(tmp_path, monkeypatch):
    (tmp_path / "f").write_text("")

    def refusal(path, **fail) -> str:
        with pytest.raises(ConfigError) as err:
            rundir.claim(path, fresh=True)
        return str(err.value)

    assert refusal(tmp_path / "f") == f"hydra.run.dir: {tmp_path / 'f'} is a file, not a directory"
    assert refusal(tmp_path / "f" / "run").endswith(f"is under {tmp_path / 'f'}, which is a file")
    assert refusal("").startswith("hydra.run.dir: empty;")
    with monkeypatch.context() as m:  # an existing dir without write permission
        m.setattr(rundir, "os", faults.FailingOs("open", errno.EACCES))
        (tmp_path / "ro").mkdir()
        assert refusal(tmp_path / "ro").endswith("ro (Permission denied)")
    with monkeypatch.context() as m:  # a new dir under a read-only mount

        def read_only(self, *args, **kwargs):
            raise OSError(errno.EROFS, "Read-only file system", str(self))

        m.setattr(Path, "mkdir", read_only)
        message = refusal(tmp_path / "mnt" / "run")
        assert message == f"hydra.run.dir: cannot write into {tmp_path / 'mnt' / 'run'} " + (
            "(Read-only file system)"
        )
    with monkeypatch.context() as m:  # a full disk at the start: refused, the new dir removed
        m.setattr(rundir, "os", faults.FailingOs("write", errno.ENOSPC))
        assert refusal(tmp_path / "full").endswith("full (No space left on device)")
        assert not (tmp_path / "full").exists()
    assert not rundir._held  # no lock kept by any refusal


def test_a_full_disk_at_a_checkpoint_keeps_the_last_one_and_the_resume_is_exact(
    compose_cfg, lifecycle, tmp_path, monkeypatch, capsys
):
    import fedexp.runtime.checkpoint as checkpoint

    ref = lifecycle.run(compose_cfg(*SMOKE[1:]), tmp_path / "ref")
    with monkeypatch.context() as m:  # the second checkpoint's write fails
        m.setattr(checkpoint, "os", faults.FailingOs("fsync", errno.ENOSPC, after=1))
        code, err = cli(tmp_path, monkeypatch, capsys, *SMOKE, "hydra.run.dir=run")
    run = tmp_path / "run"
    assert code == 1
    assert one_line(err) == (
        f"fedexp: error: {run / CHECKPOINT_FILE}.tmp: No space left on device; continue from "
        f"its last checkpoint with: python -m fedexp resume={run}"
    )
    assert torch.load(run / CHECKPOINT_FILE, weights_only=True)["round"] == 1
    assert not (run / f"{CHECKPOINT_FILE}.tmp").exists() and not (run / "summary.json").exists()
    code, err = cli(tmp_path, monkeypatch, capsys, f"resume={run}")  # space freed
    assert code == 0, err
    resumed = json.loads((run / "summary.json").read_text())
    assert resumed["resumed_from_round"] == 1 and lifecycle.final(resumed) == lifecycle.final(ref)
    assert lifecycle.rows(run) == lifecycle.rows(tmp_path / "ref")


@pytest.mark.experiment
def test_a_full_disk_at_a_metrics_row_ends_in_one_line(tmp_path, monkeypatch, capsys):
    real_open, appends = Path.open, []

    class FullDisk:  # the file of the second row: a part of it fits, then the disk is full
        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def write(self, text):
            self.f.write(text[:20])
            raise OSError(errno.ENOSPC, "No space left on device")

    def open_(self, mode="r", *args, **kwargs):
        f = real_open(self, mode, *args, **kwargs)
        if self.name == "metrics.jsonl" and mode == "a":
            appends.append(self)
            return FullDisk(f) if len(appends) == 2 else f
        return f

    monkeypatch.setattr(Path, "open", open_)
    code, err = cli(tmp_path, monkeypatch, capsys, *SMOKE, "hydra.run.dir=run")
    run = tmp_path / "run"
    assert code == 1 and one_line(err).startswith(
        f"fedexp: error: {run / 'metrics.jsonl'}: No space left on device; continue from its "
        "last checkpoint with"
    )
    assert torch.load(run / CHECKPOINT_FILE, weights_only=True)["round"] == 1


@pytest.mark.experiment
def test_a_run_dir_removed_mid_run_ends_in_one_line(tmp_path, monkeypatch, capsys):
    fault = ("+logger.fault._target_=faults.RemoveRunDir", "+logger.fault.round_idx=2")
    code, err = cli(tmp_path, monkeypatch, capsys, *SMOKE, *fault, "hydra.run.dir=run")
    run = tmp_path / "run"
    assert code == 1 and one_line(err) == (
        f"fedexp: error: {run / 'metrics.jsonl'}: No such file or directory (the run dir {run} "
        "is gone); no checkpoint was written, so the run cannot be resumed"
    )


@pytest.mark.experiment
def test_a_second_sigterm_stops_at_once_with_the_conventional_code(tmp_path, monkeypatch, capsys):
    fault = ("+logger.fault._target_=faults.SignalTwice", "+logger.fault.round_idx=2")
    code, err = cli(tmp_path, monkeypatch, capsys, *SMOKE, *fault, "hydra.run.dir=run")
    run = tmp_path / "run"
    assert code == 128 + 15
    assert one_line(err) == (
        "fedexp: stopped at once by a second SIGTERM; continue from its last checkpoint with: "
        f"python -m fedexp resume={run}"
    )
    assert torch.load(run / CHECKPOINT_FILE, weights_only=True)["round"] == 1


@pytest.mark.experiment
def test_a_sweep_job_that_raises_is_recorded_with_its_error(tmp_path, monkeypatch, capsys):
    args = ("-m", *SMOKE, "rounds=1", "+logger.fault._target_=faults.FailAt")
    args += ("+logger.fault.round_idx=1", "+hydra.callbacks.sweep_summary.report=false")
    code, err = cli(tmp_path, monkeypatch, capsys, *args, "hydra.sweep.dir=sweep")
    assert code == 1  # the sweep ends; a job failed (the others run: test_run_dir.py's sweeps)
    job = json.loads((tmp_path / "sweep" / "0" / "summary.json").read_text())
    assert job["status"] == "failed" and job["error"] == "RuntimeError: boom at round 1"
    assert "fedexp: error: RuntimeError: boom at round 1; " in err
