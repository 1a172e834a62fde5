"""executor=distributed: one run over several processes (`torchrun`), the cohort sharded by ranks.

    torchrun --nproc_per_node K -m fedexp executor=distributed [executor.inner=vectorized] ...

Every rank builds the same experiment (same seed, same data, same initial state). Each round,
every rank computes the same cohort, trains its shard of it (balanced by expected optimizer
steps, `client_costs`) with the inner executor, and one all-gather of bytes per round hands
every rank all the uploads plus the client-store entries its peers wrote (`all_gather_bytes`:
each rank's results pickled with their tensors as raw bytes, one uint8 tensor a rank through
the collective; `all_gather_object` saved every tensor with `torch.save`); every rank then
aggregates identically, so the server state stays the same everywhere without a broadcast.
Per-client seeds depend on (seed, round, client) only, so the sharding does not change what a
client computes. Rank 0 writes the outputs; the other ranks write into a temporary dir that is
removed at exit (`prepare_rank`).
"""

from __future__ import annotations

import atexit
import dataclasses
import os
import pickle
import sys
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist

from fedexp.core.algorithm import Algorithm
from fedexp.core.cohort import RoundResults
from fedexp.core.types import ConfigError, Message, RoundContext
from fedexp.engine.executors.pool import client_costs, shard
from fedexp.engine.executors.select import executor_named
from fedexp.engine.executors.sequential import import_optimizer_stack
from fedexp.engine.executors.wire import dumps
from fedexp.runtime.ranks import world


def to_device(obj: Any, device: torch.device) -> Any:
    """`obj` with every tensor inside (dataclasses, lists, tuples, dicts) moved to `device`."""
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        changes = {f.name: to_device(getattr(obj, f.name), device) for f in dataclasses.fields(obj)}
        return dataclasses.replace(obj, **changes)
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_device(v, device) for v in obj)
    if isinstance(obj, dict):
        return {k: to_device(v, device) for k, v in obj.items()}
    return obj


class DistributedExecutor:
    """Shards each round's cohort over the process group; the inner executor trains a shard.

    Args:
        inner: the executor each rank runs on its shard: auto, sequential or vectorized.
        device: the run's `device` (auto picks the inner executor from it).
        chunk_size: vectorized inner executor only: clients per vmapped call.
        backend: `auto` (nccl on CUDA, gloo on CPU), `gloo` or `nccl`.
        timeout_s: collective timeout.
    """

    def __init__(
        self,
        inner: str,
        device: str,
        chunk_size: int | None,
        backend: str,
        timeout_s: float,
    ):
        rank, size = world()
        if "RANK" not in os.environ:
            raise ConfigError(
                "executor: distributed needs torchrun (torchrun --nproc_per_node K -m fedexp ...)"
            )
        if backend == "auto":
            backend = "nccl" if torch.cuda.is_available() else "gloo"
        if backend not in ("gloo", "nccl"):
            raise ConfigError(f"executor.backend: must be auto, gloo or nccl, got {backend!r}")
        if not dist.is_initialized():
            from datetime import timedelta

            dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
            atexit.register(_shutdown)
        import_optimizer_stack()  # in start-up, not in round 1's time
        self.rank, self.size = rank, size
        self.workers = size  # the processes that train each round (`runtime/processes`)
        self.inner = executor_named(inner, device, chunk_size, key="executor.inner")

    def check_algorithm(self, algorithm: Algorithm, num_clients: int) -> None:
        """The inner executor's check of what it can train (none for sequential)."""
        check = getattr(self.inner, "check_algorithm", None)
        if check is not None:
            check(algorithm, num_clients)

    def run(
        self,
        algorithm: Algorithm,
        payloads: Mapping[int, Message],
        ctx: RoundContext,
        data,
        stats: torch.Tensor | None = None,
    ) -> RoundResults:
        mine = shard(client_costs(algorithm, ctx, data), self.size)[self.rank]
        results = RoundResults.empty()
        if mine:
            sub = dataclasses.replace(ctx, client_ids=tuple(mine))
            results = self.inner.run(algorithm, {c: payloads[c] for c in mine}, sub, data, stats)
        cpu = torch.device("cpu")
        stored = {cid: algorithm.store.get(cid) for cid in mine if cid in algorithm.store}
        mine_bytes = dumps((results.to(cpu), to_device(stored, cpu)))
        parts = []
        for rank, raw in enumerate(all_gather_bytes(mine_bytes, self._collective_device())):
            if rank == self.rank:
                parts.append(results)
                continue
            rank_results, rank_stored = pickle.loads(raw)
            for cid, state in rank_stored.items():  # so any rank can serve any client later
                algorithm.store.put(cid, to_device(state, algorithm.device))
            parts.append(rank_results.to(algorithm.device))
        return RoundResults.concat([p for p in parts if len(p)]).take(ctx.client_ids)

    def _collective_device(self) -> torch.device:
        """Where the collective's buffers live: the rank's GPU under nccl, else the CPU."""
        if dist.get_backend() == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")


def all_gather_bytes(mine, device: torch.device) -> list[memoryview]:
    """Every rank's bytes, in rank order, through two collectives: the lengths, then one uint8
    tensor a rank (padded to the longest)."""
    size = dist.get_world_size()
    length = torch.tensor([len(mine)], dtype=torch.int64, device=device)
    lengths = [torch.zeros_like(length) for _ in range(size)]
    dist.all_gather(lengths, length)
    longest = max(int(n) for n in lengths)
    buffer = torch.zeros(longest, dtype=torch.uint8, device=device)
    if len(mine):
        buffer[: len(mine)] = torch.frombuffer(mine, dtype=torch.uint8).to(device)
    buffers = [torch.empty_like(buffer) for _ in range(size)]
    dist.all_gather(buffers, buffer)
    return [memoryview(b[: int(n)].cpu().numpy()) for b, n in zip(buffers, lengths, strict=True)]


def _shutdown() -> None:
    if dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001 - exiting anyway
            print("fedexp: process group shutdown failed", file=sys.stderr)
