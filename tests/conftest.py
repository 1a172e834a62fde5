"""Shared test helpers: run the real CLI in a subprocess, read what a run wrote."""

from __future__ import annotations

import csv
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]


def run_cli(*overrides: str, cwd: Path, multirun: bool = False, check: bool = True, env=None):
    """`python -m fedexp [overrides]` in `cwd`; returns the CompletedProcess.

    Outputs go under cwd/outputs; caches and data under cwd so nothing is shared between tests.
    """
    full_env = dict(os.environ)
    full_env.update(
        WANDB_MODE="offline",
        WANDB_SILENT="true",
        FEDEXP_CACHE_DIR=str(cwd / "cache"),
        FEDEXP_DATA_DIR=str(cwd / "data"),
        PYTHONPATH=str(REPO / "src") + os.pathsep + full_env.get("PYTHONPATH", ""),
    )
    full_env.update(env or {})
    args = [sys.executable, "-m", "fedexp", *(["-m"] if multirun else []), *overrides]
    proc = subprocess.run(args, cwd=cwd, env=full_env, capture_output=True, text=True, timeout=600)
    if check and proc.returncode != 0:
        raise AssertionError(
            f"exit {proc.returncode}\nSTDOUT:\n{proc.stdout}\nSTDERR:\n{proc.stderr}"
        )
    return proc


def main_in_process(monkeypatch, capsys, *args: str) -> tuple[int, str]:
    """`python -m fedexp args...` in this process (fast; no interpreter start): (exit, stderr)."""
    from fedexp.__main__ import main

    monkeypatch.setattr(sys, "argv", ["fedexp", *args])
    # Hydra's job logging adds handlers on this test's captured streams: put the loggers back
    # as they were, so a later test's log record does not go to a closed stream
    loggers = [logging.getLogger(), *map(logging.getLogger, logging.root.manager.loggerDict)]
    saved = [(lg, list(lg.handlers), lg.level, lg.propagate) for lg in loggers]
    try:
        main()
    except SystemExit as exit_:
        return exit_.code or 0, capsys.readouterr().err
    finally:
        for lg, handlers, level, propagate in saved:
            lg.handlers[:] = handlers
            lg.level, lg.propagate = level, propagate
        known = {id(lg) for lg in loggers}
        for name in list(logging.root.manager.loggerDict):
            lg = logging.getLogger(name)
            if id(lg) not in known:  # made during the run (its handlers are on this test's streams)
                lg.handlers.clear()
    return 0, capsys.readouterr().err


def smoke_experiment(tmp_path: Path, *overrides: str):
    """An in-process `Experiment` of the real config at `debug=smoke` size (6 clients, 2 rounds)."""
    from hydra import compose, initialize_config_dir

    from fedexp.run import Experiment

    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose(
            "config",
            overrides=["debug=smoke", f"paths.cache_dir={tmp_path / 'cache'}", *overrides],
        )
    run_dir = tmp_path / "run"
    run_dir.mkdir(parents=True, exist_ok=True)
    return Experiment(cfg, run_dir)


def summaries(root: Path) -> list[dict]:
    """Every summary.json under root, in path order."""
    return [json.loads(p.read_text()) for p in sorted(root.rglob("summary.json"))]


def run_dirs(root: Path) -> list[Path]:
    return sorted(p.parent for p in root.rglob("summary.json"))


def write_sent140_csv(root: Path, users: int = 8, per_user: int = 6) -> Path:
    """A tiny Sentiment140 CSV (the original file's name and columns) under root; returns root."""
    root.mkdir(parents=True, exist_ok=True)
    with open(root / "training.1600000.processed.noemoticon.csv", "w", encoding="latin-1") as fh:
        writer = csv.writer(fh, quoting=csv.QUOTE_ALL)
        for user in range(users):
            for i in range(per_user):
                label = (user + i) % 2
                words = "great happy" if label else "awful sad"
                text = f"@friend{user} so {words} today #{i} café"
                writer.writerow([4 * label, i, "Mon Apr 06 2009", "NO_QUERY", f"u{user}", text])
    return root


@pytest.fixture
def cli(tmp_path):
    """Run the CLI in a fresh temp dir: cli('algorithm=fedprox', 'debug=smoke')."""

    def _run(*overrides, **kwargs):
        return run_cli(*overrides, cwd=tmp_path, **kwargs)

    _run.cwd = tmp_path
    return _run


# Tiny models run fastest on one thread, and a loaded machine makes torch's thread pool thrash.
os.environ.setdefault("OMP_NUM_THREADS", "1")
torch.set_num_threads(1)
