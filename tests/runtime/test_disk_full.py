"""A full disk where torch writes a file, and before the run starts: one line naming the file and
the cause, never a traceback, and nothing half-written. Torch's zip writer swallows the OSError of
a failed write and raises a RuntimeError of its own (`[enforce fail at inline_container.cc:...]
. unexpected pos ...`); any other RuntimeError of torch's is a bug and keeps its traceback."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import hydra.core.utils
import pytest
import torch

from faults import cli, one_line
from fedexp.errors import ConfigError
from fedexp.runtime import checkpoint
from fedexp.runtime import run_dir as rundir
from fedexp.runtime.checkpoint import CHECKPOINT_FILE

SMOKE = ("debug=smoke", "rounds=3", "eval_every=1", "checkpoint_every=1")
ENOSPC = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


class FullDisk:
    """A file on a disk that fills after `room` bytes: the write that does not fit raises
    ENOSPC (as the OS does once a short write has taken the last block)."""

    def __init__(self, f, room: int = 0):
        self.f, self.room = f, room

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.f.close()

    def write(self, data) -> int:
        if len(data) > self.room:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.room -= len(data)
        return self.f.write(data)

    def __getattr__(self, name):
        return getattr(self.f, name)


def full_disk_at(monkeypatch, name: str, nth: int, room: int = 0) -> None:
    """The `nth` (1: the first) opening of a file called `name` for writing is on a full disk."""
    real_open, opened = Path.open, []

    def open_(self, mode="r", *args, **kwargs):
        f = real_open(self, mode, *args, **kwargs)
        if self.name == name and "w" in mode:
            opened.append(self)
            if len(opened) == nth:
                return FullDisk(f, room)
        return f

    monkeypatch.setattr(Path, "open", open_)


def test_torch_reports_a_full_disk_as_a_runtime_error_of_its_zip_writer(tmp_path):
    # what save_atomic has to see through: the OSError is gone, the message names no file
    with (tmp_path / "x.pt").open("wb") as f, pytest.raises(RuntimeError, match="unexpected pos"):
        torch.save({"w": torch.zeros(1000)}, FullDisk(f, room=100))


def test_a_full_disk_in_torch_save_is_the_os_error_naming_the_file(tmp_path, monkeypatch):
    path = tmp_path / "model.pt"
    checkpoint.save_atomic(path, {"w": torch.ones(3)})
    full_disk_at(monkeypatch, "model.pt.tmp", nth=1, room=100)
    with pytest.raises(OSError) as err:
        checkpoint.save_atomic(path, {"w": torch.zeros(1000)})
    assert err.value.errno == errno.ENOSPC and err.value.filename == f"{path}.tmp"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.pt"]  # no temp file left
    assert torch.equal(torch.load(path, weights_only=True)["w"], torch.ones(3))  # the old one


def test_another_runtime_error_of_torch_save_keeps_its_traceback(tmp_path, monkeypatch):
    def broken(obj, f, *args, **kwargs):  # a bug: no write of the file failed
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 1 vs 2")

    monkeypatch.setattr(torch, "save", broken)
    with pytest.raises(RuntimeError, match="unexpected pos 1 vs 2"):
        checkpoint.save_atomic(tmp_path / "model.pt", {})
    assert not list(tmp_path.iterdir())


@pytest.mark.experiment
def test_a_full_disk_at_a_checkpoint_ends_in_one_line_and_keeps_the_last_one(
    tmp_path, monkeypatch, capsys
):
    full_disk_at(monkeypatch, f"{CHECKPOINT_FILE}.tmp", nth=2, room=512)  # round 2's write
    code, err = cli(tmp_path, monkeypatch, capsys, *SMOKE, "hydra.run.dir=run")
    run = tmp_path / "run"
    assert code == 1
    assert one_line(err) == (
        f"fedexp: error: {run / CHECKPOINT_FILE}.tmp: No space left on device; continue from "
        f"its last checkpoint with: python -m fedexp resume={run}"
    )
    assert torch.load(run / CHECKPOINT_FILE, weights_only=True)["round"] == 1  # intact
    assert not (run / f"{CHECKPOINT_FILE}.tmp").exists() and not (run / "summary.json").exists()


@pytest.mark.experiment
def test_a_torch_bug_at_a_checkpoint_keeps_its_traceback(tmp_path, monkeypatch, capsys):
    def broken(obj, f, *args, **kwargs):
        raise RuntimeError("a bug in a component's state")

    monkeypatch.setattr(checkpoint.torch, "save", broken)
    code, err = cli(tmp_path, monkeypatch, capsys, *SMOKE, "hydra.run.dir=run")
    assert code == 1 and "Traceback" in err  # Hydra prints the task's exception
    assert "RuntimeError: a bug in a component's state" in err and "fedexp: error" not in err


class ShortWrites:
    """The `os` module on a disk with `room` bytes left: a write takes what fits (a short
    write, as tmpfs and ext4 do) and the next one raises ENOSPC."""

    def __init__(self, room: int):
        self.room = room

    def __getattr__(self, name):
        return getattr(os, name)

    def write(self, fd, data) -> int:
        if not self.room:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        n = os.write(fd, bytes(data[: self.room]))
        self.room -= n
        return n


def test_a_nearly_full_disk_is_refused_before_the_run_starts(tmp_path, monkeypatch):
    # 8 KiB left: the probe's first write is short, the rest does not fit
    monkeypatch.setattr(rundir, "os", ShortWrites(room=8192))
    with pytest.raises(ConfigError) as err:
        rundir.claim(tmp_path / "run", fresh=True)
    assert str(err.value) == (
        f"hydra.run.dir: cannot write into {tmp_path / 'run'} (No space left on device)"
    )
    assert not (tmp_path / "run").exists() and (tmp_path / "run").resolve() not in rundir._held


@pytest.mark.experiment
def test_a_full_disk_when_hydra_writes_the_run_dir_is_one_line_and_nothing_is_left(
    tmp_path, monkeypatch, capsys
):
    real_open = open

    def open_(file, mode="r", *args, **kwargs):  # the disk fills after the probe
        if ".hydra" in Path(file).parts and "w" in mode:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(file))
        return real_open(file, mode, *args, **kwargs)

    monkeypatch.setattr(hydra.core.utils, "open", open_, raising=False)
    code, err = cli(tmp_path, monkeypatch, capsys, *SMOKE, "hydra.run.dir=run")
    assert code == 2
    assert one_line(err) == (
        f"fedexp: error: hydra.run.dir: cannot write into {tmp_path / 'run'} (No space left on "
        "device)"
    )
    assert not (tmp_path / "run").exists() and (tmp_path / "run").resolve() not in rundir._held
