"""Faults a test injects into a CLI run through its config
(`+logger.fault._target_=faults.<Name>`, built like a logger, with the run dir): a second stop
signal, a run dir removed mid-run, a job that raises; and an `os` whose chosen call fails."""

from __future__ import annotations

import errno
import os
import shutil
import signal
from pathlib import Path

from fedexp.core.callbacks import Callback


class SignalTwice(Callback):
    """Two SIGTERMs when round `round_idx` is evaluated: the second during the graceful stop."""

    def __init__(self, run_dir: Path, round_idx: int = 1):
        self.round_idx = round_idx

    def on_evaluate(self, report) -> None:
        if report.round == self.round_idx:
            os.kill(os.getpid(), signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGTERM)


class RemoveRunDir(Callback):
    """Removes the whole run dir when round `round_idx` is evaluated."""

    def __init__(self, run_dir: Path, round_idx: int = 1):
        self.run_dir, self.round_idx = Path(run_dir), round_idx

    def on_evaluate(self, report) -> None:
        if report.round == self.round_idx:
            shutil.rmtree(self.run_dir)


class FailAt(Callback):
    """Raises RuntimeError when round `round_idx` is evaluated (a bug at run time)."""

    def __init__(self, run_dir: Path, round_idx: int = 1):
        self.round_idx = round_idx

    def on_evaluate(self, report) -> None:
        if report.round == self.round_idx:
            raise RuntimeError(f"boom at round {report.round}")


class FailingOs:
    """The `os` module, except that its `name` function raises OSError(`code`) from its
    `after`-th call on (0: the first): put in a module's place with monkeypatch."""

    def __init__(self, name: str, code: int = errno.ENOSPC, after: int = 0):
        self.name, self.code, self.after, self.calls = name, code, after, 0

    def __getattr__(self, attr: str):
        real = getattr(os, attr)
        if attr != self.name:
            return real

        def failing(*args, **kwargs):
            self.calls += 1
            if self.calls > self.after:
                raise OSError(self.code, os.strerror(self.code))
            return real(*args, **kwargs)

        return failing


def cli(tmp_path, monkeypatch, capsys, *args: str) -> tuple[int, str]:
    """`python -m fedexp args...` in this process, in `tmp_path` with its own caches and data:
    (exit code, stderr)."""
    from conftest import main_in_process

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FEDEXP_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("FEDEXP_DATA_DIR", str(tmp_path / "data"))
    return main_in_process(monkeypatch, capsys, *args)


def one_line(err: str) -> str:
    """The one line of an error output (asserted: one line, `fedexp: ...`)."""
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("fedexp: "), err
    return lines[0]
