"""The partition's PNG is drawn by a forked process of its own (`PartitionStats`): at the lowest
priority, named `partition-plot`, holding none of the run's files (the run-dir lock ends with
the run); its PNG kept in the run's process for the next job on the same partition; a run
that ends while it still draws (a starved lowest-priority process) draws the plot itself; and a
run whose processes fill the cores draws it once its rounds are over."""

from __future__ import annotations

import fcntl
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from fedexp.data import partition_report
from fedexp.data.datasets import Dataset
from fedexp.data.federated import FederatedData
from fedexp.data.partition import Partition

pytestmark = pytest.mark.skipif(not Path("/proc/self/fd").exists(), reason="reads /proc")


def two_clients() -> FederatedData:
    x, y = torch.zeros(8, 2), torch.arange(8) % 2
    train = [np.arange(4), np.arange(4, 8)]
    return FederatedData(Dataset("hand", x, y, x, y, 2, (2,)), Partition(train, train), "cpu")


def slowed(monkeypatch, seconds: float) -> None:
    """The plot drawn after `seconds` (in the process forked after this)."""
    real = partition_report.plot_label_distribution

    def slow(*args, **kwargs):
        time.sleep(seconds)
        return real(*args, **kwargs)

    monkeypatch.setattr(partition_report, "_DRAWN", {})
    monkeypatch.setattr(partition_report, "plot_label_distribution", slow)


def test_the_plot_is_drawn_by_a_low_priority_process_that_holds_no_lock(tmp_path, monkeypatch):
    slowed(monkeypatch, 1.0)
    lock = open(tmp_path / "lock", "w")  # noqa: SIM115 - closed below, as a run closes its lock
    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    stats = partition_report.start_partition_stats(two_clients(), tmp_path, "hand")
    child = stats._child
    pid = child._proc.pid
    deadline = time.monotonic() + 5
    while Path(f"/proc/{pid}/comm").read_text().strip() != "partition-plot":  # named, then niced
        assert time.monotonic() < deadline
        time.sleep(0.01)
    time.sleep(0.1)
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    assert int(stat[16]) == 19  # its nice value: field 19 of stat(5)
    lock.close()  # the run ends: its lock with it, though the drawing goes on
    with open(tmp_path / "lock", "w") as again:
        fcntl.flock(again, fcntl.LOCK_EX | fcntl.LOCK_NB)  # raises BlockingIOError if held
    assert Path(f"/proc/{pid}").exists()  # still drawing
    assert child._conn.poll(60)  # it has drawn: its bytes are taken, nothing drawn here
    monkeypatch.setattr(partition_report, "plot_label_distribution", None)
    (plot, kind), _ = stats.wait()
    assert kind == "partition/label_distribution" and plot.read_bytes()[:4] == b"\x89PNG"
    # the bytes came back: the same partition's next plot is written without drawing
    (tmp_path / "next").mkdir()
    again = partition_report.start_partition_stats(two_clients(), tmp_path / "next", "hand")
    assert again.wait()[0][0].read_bytes() == plot.read_bytes()


def test_a_run_that_ends_before_the_drawing_does_draws_the_plot_itself(tmp_path, monkeypatch):
    real = partition_report.plot_label_distribution
    slowed(monkeypatch, 120.0)  # the forked process would take two minutes
    stats = partition_report.start_partition_stats(two_clients(), tmp_path, "hand")
    pid = stats._child._proc.pid
    monkeypatch.setattr(partition_report, "plot_label_distribution", real)  # this process's
    start = time.monotonic()
    (plot, _), _ = stats.wait()
    assert time.monotonic() - start < 60 and plot.read_bytes()[:4] == b"\x89PNG"
    assert not Path(f"/proc/{pid}").exists()  # stopped, and reaped


def test_a_plot_left_for_the_end_is_drawn_by_wait_and_by_nothing_before(tmp_path, monkeypatch):
    monkeypatch.setattr(partition_report, "_DRAWN", {})
    drawn = []
    real = partition_report.plot_label_distribution

    def counted(*args, **kwargs):
        drawn.append(len(drawn))
        return real(*args, **kwargs)

    monkeypatch.setattr(partition_report, "plot_label_distribution", counted)
    stats = partition_report.start_partition_stats(two_clients(), tmp_path, "hand", "end")
    assert stats._child is None and stats._thread is None  # no process, no thread
    assert (tmp_path / "partition_stats.csv").exists()  # the CSV at once
    assert not (tmp_path / "partition_labels.png").exists() and drawn == []
    (plot, kind), _ = stats.wait()
    assert kind == "partition/label_distribution" and plot.read_bytes()[:4] == b"\x89PNG"
    assert drawn == [0]
    assert stats.wait()[0][0] == plot and drawn == [0]  # drawn once


def test_a_plot_left_for_the_end_raises_what_drawing_it_raised_from_wait(tmp_path, monkeypatch):
    monkeypatch.setattr(partition_report, "_DRAWN", {})

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(partition_report, "plot_label_distribution", broken)
    stats = partition_report.start_partition_stats(two_clients(), tmp_path, "hand", "end")
    with pytest.raises(OSError, match="disk full"):
        stats.wait()
