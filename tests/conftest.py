"""Shared test helpers: run the real CLI in a subprocess or in this process, compose a config and
run an Experiment in this process, read what a run wrote."""

from __future__ import annotations

import csv
import json
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from fedexp.core.callbacks import Callback

REPO = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent


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
    code, _, err = main_captured(monkeypatch, capsys, *args)
    return code, err


def main_captured(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    """main_in_process, with what the run printed: (exit, stdout, stderr)."""
    from fedexp.__main__ import main

    monkeypatch.setattr(sys, "argv", ["fedexp", *args])
    # Hydra's job logging adds handlers on this test's captured streams: put the loggers back
    # as they were, so a later test's log record does not go to a closed stream
    loggers = [logging.getLogger(), *map(logging.getLogger, logging.root.manager.loggerDict)]
    saved = [(lg, list(lg.handlers), lg.level, lg.propagate) for lg in loggers]
    try:
        main()
    except SystemExit as exit_:
        out, err = capsys.readouterr()
        return exit_.code or 0, out, err
    finally:
        for lg, handlers, level, propagate in saved:
            lg.handlers[:] = handlers
            lg.level, lg.propagate = level, propagate
        known = {id(lg) for lg in loggers}
        for name in list(logging.root.manager.loggerDict):
            lg = logging.getLogger(name)
            if id(lg) not in known:  # made during the run (its handlers are on this test's streams)
                lg.handlers.clear()
    out, err = capsys.readouterr()
    return 0, out, err


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


@pytest.fixture(autouse=True)
def restore_root_logging():
    """The CLI run in-process (Hydra, resume) configures root logging; undo it after a test so
    no handler outlives its captured stream or its deleted run dir."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in list(root.handlers):
        if handler not in handlers:
            root.removeHandler(handler)
            handler.close()
    root.setLevel(level)


@pytest.fixture
def compose_cfg(tmp_path, monkeypatch):
    """compose_cfg('algorithm=fedprox', ...) -> the DictConfig the CLI would build."""
    import torch
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    monkeypatch.setenv("FEDEXP_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("FEDEXP_DATA_DIR", str(tmp_path / "data"))
    # tiny models: one intra-op thread; several threads on a busy machine are many times slower
    torch.set_num_threads(1)

    def _compose(*overrides: str):
        GlobalHydra.instance().clear()
        with initialize_config_dir(str(REPO / "conf"), version_base="1.3"):
            return compose("config", overrides=["debug=smoke", *overrides])

    return _compose


def run_experiment(cfg, run_dir: Path, resume: bool = False, callbacks=(), loggers=()) -> dict:
    """Build and run one job in this process, as the CLI does (minus Hydra's run dir); returns
    the summary in its summary.json form."""
    from fedexp.run import Experiment

    run_dir.mkdir(parents=True, exist_ok=True)
    experiment = Experiment(cfg, run_dir, resume=resume)
    experiment.callbacks.extend(callbacks)
    return experiment.run(list(loggers)).to_dict()


class SignalAfter(Callback):
    """A callback that sends this process `signum` when round `round_idx` is evaluated."""

    def __init__(self, round_idx: int, signum: int = signal.SIGTERM):
        self.round_idx, self.signum = round_idx, signum

    def on_evaluate(self, report) -> dict:
        if report.round == self.round_idx:
            os.kill(os.getpid(), self.signum)
        return {}


def metric_rows(run_dir: Path) -> list[dict]:
    """metrics.jsonl rows without the time/* keys (they differ between any two runs)."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]


def final_metrics(summary: dict) -> dict:
    return {k: v for k, v in summary["metrics"].items() if not k.startswith("time/")}


@pytest.fixture
def lifecycle():
    """The helpers above, as a fixture (test files do not import conftest modules)."""
    from types import SimpleNamespace

    return SimpleNamespace(
        run=run_experiment,
        SignalAfter=SignalAfter,
        rows=metric_rows,
        final=final_metrics,
        tests_dir=TESTS,
        repo=REPO,
    )


@pytest.fixture
def two_clients():
    """Client 0 holds x=[1,2], y=0; client 1 holds x=[2,0], y=1 (one sample each)."""
    from handworld import two_client_data

    return two_client_data()


@pytest.fixture
def cli_in_process(tmp_path, monkeypatch, capsys):
    """The `cli` fixture's runs in this process (no interpreter start, no import of torch again):
    for tests of what a run does, not of the process. Returns what `cli` returns (returncode,
    stdout, stderr); `env` entries are set for the run only."""
    from types import SimpleNamespace

    def _run(*overrides, multirun: bool = False, check: bool = True, env=None):
        with monkeypatch.context() as patch:
            patch.chdir(tmp_path)
            patch.setenv("WANDB_MODE", "offline")
            patch.setenv("WANDB_SILENT", "true")
            patch.setenv("FEDEXP_CACHE_DIR", str(tmp_path / "cache"))
            patch.setenv("FEDEXP_DATA_DIR", str(tmp_path / "data"))
            for key, value in (env or {}).items():
                patch.setenv(key, value)
            args = [*(["-m"] if multirun else []), *overrides]
            code, out, err = main_captured(patch, capsys, *args)
        if check and code != 0:
            raise AssertionError(f"exit {code}\nSTDOUT:\n{out}\nSTDERR:\n{err}")
        return SimpleNamespace(returncode=code, stdout=out, stderr=err)

    _run.cwd = tmp_path
    return _run


# Markers for the edit-test loop (`make test-fast` deselects both), by folder and by fixture:
# `cli` for the tests of an entry point (tests/cli: the CLI, sweeps, evaluate; tests/claims and
# tests/report: `python -m fedexp.claims` and `python -m fedexp.report`) and for a test using a
# fixture that starts a process; `experiment` for a test using a fixture that builds a whole
# Experiment (in this process or through the CLI's main). A test that does either without such a
# fixture marks itself (`pytestmark` or a decorator).
FOLDER_MARKERS = {"cli": ("cli",), "claims": ("cli",), "report": ("cli",)}
FIXTURE_MARKERS = {
    "cli": ("cli",),
    "cli_in_process": ("experiment",),
    "lifecycle": ("experiment",),
    "compose_cfg": ("experiment",),
}


def pytest_collection_modifyitems(config, items):
    for item in items:
        path = Path(item.path)
        folder = path.relative_to(TESTS).parts[0] if TESTS in path.parents else ""
        names = [*FOLDER_MARKERS.get(folder, ())]
        names += [marker for name in item.fixturenames for marker in FIXTURE_MARKERS.get(name, ())]
        for name in dict.fromkeys(names):
            if item.get_closest_marker(name) is None:
                item.add_marker(name)

    # the longest tests first (those that start a process, then whole runs): the workers of
    # `pytest -n 2` then end on short tests together instead of one waiting for the other
    def rank(item) -> int:
        return next(
            (i for i, n in enumerate(("cli", "experiment")) if item.get_closest_marker(n)), 2
        )

    items.sort(key=rank)


# Tiny models run fastest on one thread, and a loaded machine makes torch's thread pool thrash.
os.environ.setdefault("OMP_NUM_THREADS", "1")


def pytest_configure(config):
    # torch where tests run: not in the process of `pytest -n 2` that only hands out the tests
    # (importing it there cost each run seconds of CPU while the workers start)
    if hasattr(config, "workerinput") or not getattr(config.option, "numprocesses", None):
        import torch

        torch.set_num_threads(1)
