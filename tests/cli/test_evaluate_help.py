"""`python -m fedexp.evaluate --help` (or -h) prints its usage and exits 0."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conftest import REPO
from fedexp import evaluate


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_prints_the_usage(flag, capsys):
    evaluate.main([flag])  # returns: exit code 0
    out, err = capsys.readouterr()
    assert out.startswith("usage: python -m fedexp.evaluate <run dir> [split=test|val]")
    assert "dataset.<key>=<value>" in out and err == ""


def test_help_through_the_interpreter(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "fedexp.evaluate", "--help"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO / "src")},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0 and proc.stderr == ""
    assert proc.stdout.startswith("usage: python -m fedexp.evaluate <run dir>")
