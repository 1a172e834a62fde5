"""A SIGTERM or SIGINT that arrives in the last round (its evaluation) or after it (the final
model, the summary) lets the run complete: status completed, summary and model written, exit 0.
A second one still stops at once; in a sweep the sweep stops after that job. An interrupted
run's summary says which round its metrics come from (`metrics["round"]`)."""

from __future__ import annotations

import json
import os
import signal

import pytest

from conftest import main_captured
from fedexp.core.callbacks import Callback
from fedexp.run import lifecycle as run_lifecycle
from fedexp.runtime import run_dir as rundir
from fedexp.runtime.checkpoint import CHECKPOINT_FILE
from fedexp.runtime.final_model import MODEL_FILE

pytestmark = pytest.mark.experiment

SMOKE = ("debug=smoke", "eval_every=1", "checkpoint_every=1")  # 2 rounds


class Escaped(Exception):
    """A stop signal that reached the handler the test process had before the run."""


@pytest.fixture(autouse=True)
def outside_handlers():
    """Handlers for the test process while a run holds none: a signal the run does not hold
    fails the test instead of ending the test process."""

    def escaped(signum, frame):
        raise Escaped(signal.Signals(signum).name)

    before = {s: signal.signal(s, escaped) for s in (signal.SIGINT, signal.SIGTERM)}
    yield
    for s, handler in before.items():
        signal.signal(s, handler)


def kill(signum: int = signal.SIGTERM, times: int = 1) -> None:
    for _ in range(times):
        os.kill(os.getpid(), signum)


class SignalAtRunEnd(Callback):
    """Sends the signal when the run ends, before the summary is written."""

    def __init__(self, signum: int):
        self.signum = signum

    def on_run_end(self, summary) -> None:
        kill(self.signum)


class SignalAtRoundEnd(Callback):
    def __init__(self, round_idx: int):
        self.round_idx = round_idx

    def on_round_end(self, report) -> None:
        if report.round == self.round_idx:
            kill()


def signal_when_saving_the_model(monkeypatch, signum=signal.SIGTERM, times=1, once=False):
    real, calls = run_lifecycle.save_final_models, []

    def saving(*args, **kwargs):
        calls.append(1)
        if not once or len(calls) == 1:
            kill(signum, times)
        return real(*args, **kwargs)

    monkeypatch.setattr(run_lifecycle, "save_final_models", saving)


def test_a_signal_in_the_last_rounds_evaluation_lets_the_run_complete(
    compose_cfg, lifecycle, tmp_path
):
    cfg = compose_cfg(*SMOKE)
    summary = lifecycle.run(cfg, tmp_path / "run", callbacks=[lifecycle.SignalAfter(2)])
    assert summary["status"] == "completed" and summary["rounds_completed"] == 2
    assert summary["stop_signal"] is None
    saved = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert saved["status"] == "completed" and (tmp_path / "run" / MODEL_FILE).is_file()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_while_the_summary_is_written_lets_the_run_complete(
    compose_cfg, lifecycle, tmp_path, signum
):
    cfg = compose_cfg(*SMOKE)
    summary = lifecycle.run(cfg, tmp_path / "run", callbacks=[SignalAtRunEnd(signum)])
    assert summary["status"] == "completed"
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["status"] == "completed"


def test_a_signal_while_the_final_model_is_saved_completes_the_run_through_the_cli(
    cli_in_process, monkeypatch
):
    signal_when_saving_the_model(monkeypatch)
    proc = cli_in_process(*SMOKE, "hydra.run.dir=run", check=False)
    run = cli_in_process.cwd / "run"
    assert proc.returncode == 0, proc.stderr
    assert json.loads((run / "summary.json").read_text())["status"] == "completed"
    assert (run / MODEL_FILE).is_file() and "completed after 2 rounds" in proc.stdout
    assert "interrupted" not in proc.stdout + proc.stderr


def test_a_second_signal_after_the_last_round_stops_at_once(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FEDEXP_CACHE_DIR", str(tmp_path / "cache"))
    signal_when_saving_the_model(monkeypatch, times=2)
    code, _, err = main_captured(monkeypatch, capsys, *SMOKE, "hydra.run.dir=run")
    run = tmp_path / "run"
    assert code == 128 + signal.SIGTERM
    assert err.strip() == (
        "fedexp: stopped at once by a second SIGTERM; continue from its last checkpoint with: "
        f"python -m fedexp resume={run}"
    )
    assert not (run / "summary.json").exists() and not (run / MODEL_FILE).exists()


def test_a_signal_after_a_sweep_jobs_last_round_stops_the_sweep_after_that_job(
    cli_in_process, monkeypatch
):
    signal_when_saving_the_model(monkeypatch, once=True)
    args = (*SMOKE, "seed=0,1", "~hydra.callbacks.sweep_summary", "hydra.sweep.dir=sweep")
    proc = cli_in_process(*args, multirun=True, check=False)
    sweep = cli_in_process.cwd / "sweep"
    rundir.release(sweep)  # the process would end here, and the OS drop the sweep's lock
    assert proc.returncode == 128 + signal.SIGTERM
    # the job finished; the sweep stops and names the command that continues it
    continue_line = "fedexp: SIGTERM: the sweep stopped; continue it with: python -m fedexp -m"
    assert continue_line in proc.stderr
    assert json.loads((sweep / "0" / "summary.json").read_text())["status"] == "completed"
    assert not (sweep / "1").exists()


def test_an_interrupted_runs_summary_names_the_round_of_its_metrics(
    compose_cfg, lifecycle, tmp_path
):
    # evaluated rounds 2, 4, 5; stopped after round 3: the metrics are round 2's
    cfg = compose_cfg("rounds=5", "eval_every=2", "checkpoint_every=0")
    summary = lifecycle.run(cfg, tmp_path / "run", callbacks=[SignalAtRoundEnd(3)])
    assert summary["status"] == "interrupted" and summary["rounds_completed"] == 3
    assert summary["checkpoint_round"] == 3 and summary["metrics"]["round"] == 2
    assert (tmp_path / "run" / CHECKPOINT_FILE).is_file()
