"""Pieces of executor=distributed that need no process group: sharding and moving results."""

from __future__ import annotations

import pytest
import torch

from components import yaml_options
from fedexp.core.types import ClientResult, ConfigError, Weights
from fedexp.engine.executors.distributed import DistributedExecutor, shard, to_device
from fedexp.runtime.ranks import prepare_rank


def test_shard_balances_samples_largest_first():
    # 50 -> s0, 40 -> s1, 30 -> s1 (40 < 50), 20 -> s0 (50 < 70), 10 -> s0 (70 = 70, lower id)
    sizes = {0: 10, 1: 50, 2: 20, 3: 40, 4: 30}
    assert shard(sizes, 2) == [[0, 1, 2], [3, 4]]
    assert shard(sizes, 1) == [[0, 1, 2, 3, 4]]
    assert shard({7: 5}, 3) == [[7], [], []]


def test_to_device_rebuilds_frozen_messages():
    result = ClientResult(3, 10, Weights(torch.ones(2)), torch.tensor(0.5), 4, malicious=True)
    moved = to_device(result, torch.device("meta"))
    assert moved.upload is not result.upload and moved.upload.values.device.type == "meta"
    assert isinstance(moved.upload, Weights) and moved.num_steps == 4 and moved.malicious


def test_outside_torchrun_nothing_changes(monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert prepare_rank(["a=1"]) == ["a=1"]
    with pytest.raises(ConfigError, match="torchrun"):
        DistributedExecutor(**yaml_options("executor", "distributed", device="auto"))


def test_ranks_above_zero_write_to_a_scratch_dir(monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    extra = prepare_rank(["a=1"])
    assert extra[0] == "a=1" and any(a.startswith("hydra.run.dir=") for a in extra)
    assert "hydra/job_logging=disabled" in extra
