"""Helpers for lifecycle tests: compose a config and run an Experiment in this process."""

from __future__ import annotations

import json
import logging
import os
import signal
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from fedexp.core.callbacks import Callback

REPO = Path(__file__).resolve().parents[2]
SMOKE_DIR = Path(__file__).resolve().parent


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
        smoke_dir=SMOKE_DIR,
        repo=REPO,
    )
