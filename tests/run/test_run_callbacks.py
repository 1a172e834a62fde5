"""The run's callbacks are built in one place (`fedexp.run.callbacks.build_callbacks`), in the
order the round loop calls them, and the list is logged."""

from __future__ import annotations

import logging

import pytest

from conftest import smoke_experiment
from fedexp.core.callbacks import Callback
from fedexp.run import saved_components
from fedexp.run.callbacks import build_callbacks

# the callbacks a command-line run builds, on a whole Experiment
pytestmark = [pytest.mark.cli, pytest.mark.experiment]


class Added(Callback):
    pass


class Logger(Callback):
    pass


def test_the_order_is_own_then_recorder_loggers_progress_and_the_checkpointer_last(
    tmp_path, caplog
):
    exp = smoke_experiment(tmp_path, "privacy=mia", "progress=false")
    exp.callbacks.append(Added())
    with caplog.at_level(logging.INFO, logger="fedexp.run.callbacks"):
        built = build_callbacks(exp.components, [Logger()], progress=True)
    names = [type(cb).__name__ for cb in built.all]
    assert names == [
        "AuditCallback",
        "Added",
        "RunRecorder",
        "Logger",
        "ProgressLines",
        "Checkpointer",
    ]
    assert built.bar is None  # progress=false: plain lines, no bar
    assert f"callbacks: {', '.join(names)}" in caplog.messages
    # the checkpoint keeps the audit's state under its adapter's key, the added callback next
    saved = saved_components(exp.components)
    assert saved["callback0"] is exp.audits[0] and isinstance(saved["callback1"], Added)


def test_a_process_that_writes_no_outputs_gets_no_loggers_and_no_progress(tmp_path):
    exp = smoke_experiment(tmp_path)
    built = build_callbacks(exp.components, [Logger()], progress=True, output_rank=False)
    assert [type(cb).__name__ for cb in built.all] == ["RunRecorder", "Checkpointer"]
