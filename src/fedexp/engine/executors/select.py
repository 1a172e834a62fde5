"""Which executor runs a round: executor=auto|sequential|vectorized, and auto's fallback."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

import torch

from fedexp.core.algorithm import Algorithm
from fedexp.core.cohort import RoundResults
from fedexp.core.types import ConfigError, Message, RoundContext
from fedexp.engine.executors.pool import PoolExecutor
from fedexp.engine.executors.sequential import SequentialExecutor
from fedexp.engine.executors.vectorized import VectorizedExecutor
from fedexp.runtime.threads import given_cores, omp_threads

log = logging.getLogger(__name__)


def executor_named(
    name: str,
    device: str = "auto",
    chunk_size: int | None = None,
    key: str = "executor",
):
    """The executor `name` (auto | sequential | vectorized); auto: vectorized on CUDA only.

    On 2-core CPUs a vmapped cohort measured 0.3-1.3x the sequential loop, so it does not pay.
    """
    if name == "auto":
        cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
        name = "vectorized" if cuda else "sequential"
    if name == "sequential":
        return SequentialExecutor()
    if name == "vectorized":
        return VectorizedExecutor(chunk_size, False, False, device, stack="auto")
    raise ConfigError(f"{key}: must be auto, sequential or vectorized, got {name!r}")


def cpu_workers(workers, device: str, threads, clients_per_round: int | None) -> tuple[int, str]:
    """(processes, why) of `executor=auto`: on a CPU, min(cores, cohort) processes (cores as
    `threads: auto` counts them: affinity, SLURM, and OMP_NUM_THREADS set by a user or a
    parallel sweep's launcher; divided by `threads` where that is a number); 1 on CUDA, under
    torchrun, on one core, or for a cohort of one. `workers`: auto, or a number of processes."""
    if workers != "auto" and (
        isinstance(workers, bool) or not isinstance(workers, int) or workers < 1
    ):
        raise ConfigError(f"executor.workers: must be auto or an integer >= 1, got {workers!r}")
    cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
    if cuda:
        return 1, "training on CUDA"
    if "RANK" in os.environ:
        return 1, "a torchrun rank"
    cohort = max(int(clients_per_round or 1), 1)
    if workers != "auto":
        return min(workers, cohort), f"executor.workers={workers}"
    cores = given_cores()
    per_process = threads if isinstance(threads, int) and not isinstance(threads, bool) else 1
    usable = max(cores // max(per_process, 1), 1)
    count = min(usable, cohort)
    source = "OMP_NUM_THREADS" if omp_threads() is not None else "available"
    why = f"{cores} cores {source}, {cohort} clients a round"
    return count, why


class AutoExecutor:
    """executor=auto: vectorized when training runs on CUDA; on a CPU, sequential in one
    process, or the cohort sharded over the cores (`PoolExecutor`, `cpu_workers`); sequential
    too where the vectorized executor refuses the algorithm's modules (BatchNorm running
    statistics, an optimizer it has no functional form of): decided before training, and
    logged."""

    def __init__(
        self,
        device: str,
        chunk_size: int | None,
        workers="auto",
        threads="auto",
        clients_per_round: int | None = None,
    ):
        self.inner = executor_named("auto", device, chunk_size)
        self.workers, why = cpu_workers(workers, device, threads, clients_per_round)
        if self.workers > 1:
            self.inner = PoolExecutor(self.workers, threads if isinstance(threads, int) else 1)
            log.info("executor=auto: %d processes (%s)", self.workers, why)
        else:
            log.info("executor=auto: one process (%s)", why)

    def close(self) -> None:
        close = getattr(self.inner, "close", None)
        if close is not None:
            close()

    def start(self, algorithm: Algorithm, data) -> None:
        """The pool's workers, forked before the first round (`PoolExecutor.start`)."""
        start = getattr(self.inner, "start", None)
        if start is not None:
            start(algorithm, data)

    def check_algorithm(self, algorithm: Algorithm, num_clients: int) -> None:
        check = getattr(self.inner, "check_algorithm", None)
        if check is None:
            return
        try:
            check(algorithm, num_clients)
        except ConfigError as err:
            log.info("executor=auto: sequential (%s)", err)
            self.inner = SequentialExecutor()

    def run(
        self,
        algorithm: Algorithm,
        payloads: Mapping[int, Message],
        ctx: RoundContext,
        data,
        stats: torch.Tensor | None = None,
    ) -> RoundResults:
        return self.inner.run(algorithm, payloads, ctx, data, stats)


def auto_executor(
    device: str, chunk_size: int | None, workers, threads, clients_per_round: int | None
) -> AutoExecutor:
    """executor=auto: vectorized when training runs on CUDA; on a CPU, the cohort over the
    cores' processes (one process on one core)."""
    return AutoExecutor(device, chunk_size, workers, threads, clients_per_round)
