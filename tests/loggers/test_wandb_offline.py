"""W&B without a network costs seconds: an online init that gets no answer within
`init_timeout` goes on offline, with one warning line saying how to sync later."""

from __future__ import annotations

import time

import pytest

from components import wandb_options
from fedexp.loggers import wandb_logger
from fedexp.loggers.wandb_logger import WandbLogger

# a whole run that waits out W&B's init timeout
pytestmark = pytest.mark.cli

UNREACHABLE = "http://127.0.0.1:9"  # the discard port: nothing answers there


def test_an_unreachable_server_costs_the_init_timeout_then_the_run_goes_on_offline(
    compose_cfg, lifecycle, tmp_path, monkeypatch, caplog
):
    monkeypatch.setattr(wandb_logger, "_unreachable", None)
    monkeypatch.setenv("WANDB_BASE_URL", UNREACHABLE)
    monkeypatch.setenv("WANDB_API_KEY", "a" * 40)
    monkeypatch.setenv("WANDB_MODE", "online")
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = compose_cfg("rounds=2", "eval_every=1")
    first, second = (
        WandbLogger(tmp_path / d, **wandb_options(init_timeout=2)) for d in ("one", "two")
    )
    assert first.mode == "online"  # an API key is set: online is what the user asked for
    start = time.monotonic()
    with caplog.at_level("WARNING", logger=wandb_logger.__name__):
        summary = lifecycle.run(cfg, tmp_path / "one", loggers=[first])
        lifecycle.run(cfg, tmp_path / "two", loggers=[second])
    # W&B's default waits 90 s per job; here 2 s plus the service start and two tiny runs
    assert time.monotonic() - start < 60
    assert summary["status"] == "completed"
    warnings = [r.getMessage() for r in caplog.records if r.getMessage().startswith("W&B")]
    assert len(warnings) == 2, warnings  # one line per job
    offline = sorted((tmp_path / "one" / "wandb").glob("offline-run-*"))
    assert len(offline) == 1 and f"upload later with: wandb sync {offline[0]}" in warnings[0]
    assert "CommError" in warnings[0] and "as earlier in this process" in warnings[1]
    assert first.mode == second.mode == "offline"
    assert len(list((tmp_path / "two" / "wandb").glob("offline-run-*"))) == 1
    assert not list((tmp_path / "two" / "wandb").glob("run-*"))  # no second online attempt
