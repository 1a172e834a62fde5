"""W&B offline says so: a single run logs the command that uploads it, a sweep prints one line at
its end whose command the installed `wandb sync` accepts; the config records the resolved
objective. `wandb.init` is replaced by a stand-in (no W&B service), the CLI runs `--dry-run`."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner
from omegaconf import OmegaConf

from fedexp.core.callbacks import RunInfo
from fedexp.loggers import wandb_logger
from fedexp.loggers.wandb_logger import WandbLogger
from fedexp.sweep import wandb_offline_line

# what the command line logs and prints, through its main
pytestmark = pytest.mark.cli

OPTIONS = dict(
    project="p", entity=None, mode="offline", tags=None, init_timeout=5.0, verbose=False,
    log_checkpoint=False,
)  # fmt: skip


@pytest.fixture
def inits(monkeypatch):
    """The keyword arguments of each `wandb.init`; the run it returns writes nothing."""
    import wandb  # here, not at collection: each test worker would import it

    calls = []

    def init(**kwargs):
        calls.append(kwargs)
        run_dir = Path(kwargs["dir"]) / "wandb" / "offline-run-20250101_000000-abc"
        return SimpleNamespace(dir=str(run_dir / "files"), define_metric=lambda *a, **k: None)

    monkeypatch.setattr(wandb, "init", init)
    return calls


def start(run_dir: Path, objective: str | None) -> WandbLogger:
    logger = WandbLogger(run_dir, **OPTIONS)
    info = RunInfo(run_dir, {"seed": 0, "objective": "auto"}, "r", None, 5, objective=objective)
    logger.on_run_start(info)
    return logger


def test_an_offline_run_says_so_with_its_sync_command_and_records_its_objective(
    tmp_path, inits, caplog
):
    with caplog.at_level("INFO", logger=wandb_logger.__name__):
        start(tmp_path / "run", "eval/val/personal/acc_mean")
    assert inits[0]["config"]["objective"] == "eval/val/personal/acc_mean"  # not `auto`
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("W&B")]
    assert lines == [f"W&B: offline; upload with: wandb sync {tmp_path}/run/wandb/offline-run-*"]


def test_a_sweep_job_leaves_the_line_to_the_sweep(tmp_path, inits, caplog):
    run_dir = tmp_path / "sweep" / "0"
    (run_dir / ".hydra").mkdir(parents=True)
    hydra = {"mode": "MULTIRUN", "overrides": {"task": ["seed=0"]}, "runtime": {"choices": {}}}
    OmegaConf.save({"hydra": hydra}, run_dir / ".hydra" / "hydra.yaml")
    with caplog.at_level("INFO", logger=wandb_logger.__name__):
        start(run_dir, None)
    assert inits[0]["config"]["objective"] == "auto"  # no resolved objective given: as configured
    assert not [r for r in caplog.records if r.getMessage().startswith("W&B")]


def test_the_sweep_line_names_a_command_that_wandb_sync_accepts(tmp_path, monkeypatch):
    sweep = tmp_path / "sweep"
    assert wandb_offline_line(sweep) is None  # no offline run: no line
    for job in ("0", "1"):  # each job keeps its runs in <job dir>/wandb/
        run = sweep / job / "wandb" / f"offline-run-20250101_00000{job}-ab{job}"
        run.mkdir(parents=True)
        (run / f"run-ab{job}.wandb").touch()
    line = wandb_offline_line(sweep)
    command = f"wandb sync {sweep.resolve()}/*/wandb/offline-run-*"
    assert line == f"W&B: offline, 2 runs; upload them with: {command}"
    from wandb.cli.cli import sync

    monkeypatch.setenv("WANDB_MODE", "offline")
    from wandb.errors import term

    # an earlier wandb.init in this process (WANDB_SILENT, as `make test` sets) silences wandb's
    # terminal output for the rest of the process; the dry run must print
    monkeypatch.setattr(term, "_silent", False)
    monkeypatch.setattr(term, "_show_info", True)
    paths = sorted(str(p) for p in sweep.glob("*/wandb/offline-run-*"))  # as the shell expands
    found = CliRunner().invoke(sync, ["--dry-run", *paths])
    assert found.exit_code == 0 and "Would sync 2 run(s)" in found.output, found.output
    alone = CliRunner().invoke(sync, ["--dry-run", str(sweep)])  # the sweep dir names none
    assert "No runs to sync" in alone.output, alone.output
