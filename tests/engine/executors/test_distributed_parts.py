"""Pieces of executor=distributed that need no process group: sharding and moving results."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from components import yaml_options
from fedexp.core.types import ClientResult, ConfigError, RoundContext, Weights
from fedexp.engine.executors.distributed import DistributedExecutor, shard, to_device
from fedexp.engine.executors.pool import client_costs
from fedexp.runtime.ranks import prepare_rank


def test_shard_balances_samples_largest_first():
    # 50 -> s0, 40 -> s1, 30 -> s1 (40 < 50), 20 -> s0 (50 < 70), 10 -> s0 (70 = 70, lower id)
    sizes = {0: 10, 1: 50, 2: 20, 3: 40, 4: 30}
    assert shard(sizes, 2) == [[0, 1, 2], [3, 4]]
    assert shard(sizes, 1) == [[0, 1, 2, 3, 4]]
    assert shard({7: 5}, 3) == [[7], [], []]


def test_client_costs_count_each_clients_steps_and_its_fixed_cost():
    # B = 4: n = 10 -> 3 steps an epoch, n = 4 -> 1, n = 1 -> 1; E = 2; + 2 each
    client = SimpleNamespace(
        local_epochs=2,
        steps_per_epoch=lambda n: -(-n // 4),
        work=lambda seed, t, cid: None,
        budget=lambda work, n: None,
    )
    algorithm = SimpleNamespace(ctx=SimpleNamespace(client=client))
    data = SimpleNamespace(num_train={5: 10, 6: 4, 7: 1}.__getitem__)
    ctx = RoundContext(1, (5, 6, 7), 0)
    assert client_costs(algorithm, ctx, data) == {5: 8, 6: 4, 7: 4}
    # a drawn step budget (epochs 3, cap 5 steps): min(3 x 3, 5) + 2; drawn epochs (4, None)
    client.work = lambda seed, t, cid: cid
    client.budget = lambda work, n: {5: (3, 5), 6: (4, None), 7: None}[work]
    assert client_costs(algorithm, ctx, data) == {5: 7, 6: 6, 7: 4}
    # the shards balance the costs: 8 | 4 + 4
    assert shard({5: 8, 6: 4, 7: 4}, 2) == [[5], [6, 7]]


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


def _gather_rank(rank: int, store_path: str, out) -> None:
    """A rank of a 2-process gloo group: its results and store entries through
    `all_gather_bytes`, what every rank sent read back."""
    import pickle

    import torch.distributed as dist

    from fedexp.engine.executors.distributed import all_gather_bytes
    from fedexp.engine.executors.wire import dumps

    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=2)
    try:
        mine = (
            {"rank": rank, "upload": torch.arange(5.0) * (rank + 1), "half": torch.ones(3).half()}
            if rank == 0
            else {"rank": rank, "entries": {7: torch.full((2, 2), 7.0)}}
        )
        raw = all_gather_bytes(dumps(mine), torch.device("cpu"))
        [pickle.loads(r) for r in raw]  # each rank reads what it gathered
        # the bytes back, not tensors: a tensor through a multiprocessing queue leaves its
        # storage behind a handle that this process, gone by then, would have to serve
        out.put((rank, [bytes(r) for r in raw]))
    finally:
        dist.destroy_process_group()


def test_all_gather_bytes_gives_every_rank_every_ranks_tensors(tmp_path):
    import multiprocessing
    import pickle

    # Prepare: two ranks of unequal payloads (the shorter padded in the collective)
    context = multiprocessing.get_context("fork")
    out = context.Queue()
    procs = [
        context.Process(target=_gather_rank, args=(r, str(tmp_path / "store"), out))
        for r in range(2)
    ]
    # Execute
    for proc in procs:
        proc.start()
    got = {
        rank: [pickle.loads(r) for r in raw] for rank, raw in (out.get(timeout=60) for _ in procs)
    }
    for proc in procs:
        proc.join(timeout=30)
    # Assert: both ranks read both payloads, in rank order, tensors and dtypes intact
    for rank in (0, 1):
        first, second = got[rank]
        assert first["rank"] == 0 and torch.equal(first["upload"], torch.arange(5.0))
        assert first["half"].dtype == torch.float16 and first["half"].tolist() == [1.0] * 3
        assert second["rank"] == 1 and torch.equal(second["entries"][7], torch.full((2, 2), 7.0))
