"""A round's cohort trained over the machine's cores: W processes, one run (`executor=auto` on a
CPU with cores to spare; `fedexp.engine.executors.select` decides).

The run's process forks W - 1 workers when its first round starts (Python's `multiprocessing`,
fork start method): each inherits the built experiment — the algorithm, its client modules and
the data — as the parent's own memory pages, shared copy-on-write (the data's tensors are
never written, so they are never copied). Each round, the cohort is sharded by sample count as
the distributed executor shards it (`shard`); the parent sends each worker its
shard — the round's context, the shard's payloads, the broadcast statistics and the client-store
entries of its clients — through a pipe, trains shard 0 itself, and takes back each worker's
results and the store entries its clients left. Each client trains exactly as in the sequential
executor (`run_client`: seeds from (seed, round, client), the same thread count), so the results
are the sequential executor's, bit for bit.

Only the parent runs the round loop: sampling, aggregation, evaluation, checkpoints, signals,
loggers and the run-dir lock stay where they are. Workers ignore SIGINT and SIGTERM (the parent
finishes its round and stops them), die with the parent (PR_SET_PDEATHSIG, and a pipe that
closes), and leave with `os._exit`, running none of the parent's exit handlers.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import multiprocessing
import os
import signal
import sys
import threading
import traceback
import weakref
from collections.abc import Mapping

import torch

from fedexp.core.algorithm import Algorithm
from fedexp.core.client_store import ClientStore
from fedexp.core.cohort import RoundResults
from fedexp.core.types import Message, RoundContext
from fedexp.engine.executors.sequential import SequentialExecutor

log = logging.getLogger(__name__)
PR_SET_PDEATHSIG = 1  # prctl(2): the signal a process gets when its parent dies


# a client's fixed cost (its module's reset, the payload written in, its result built), in
# optimizer steps of a small model: what `client_costs` adds to each client's steps
CLIENT_OVERHEAD_STEPS = 2


def client_costs(algorithm: Algorithm, ctx: RoundContext, data) -> dict[int, int]:
    """Each of the round's clients' expected training time, in optimizer steps: its local epochs
    (or the work it drew, `client.local_work`) of ceil(n / B) steps, plus `CLIENT_OVERHEAD_STEPS`.
    The shards balance these (`shard`): balancing the samples leaves a shard of small clients,
    whose last batches are short, slower than its share."""
    client = algorithm.ctx.client
    costs = {}
    for cid in ctx.client_ids:
        n = data.num_train(cid)
        budget = client.budget(client.work(ctx.seed, ctx.round, cid), n)
        epochs, cap = budget if budget is not None else (client.local_epochs, None)
        steps = epochs * client.steps_per_epoch(n)
        costs[cid] = (steps if cap is None else min(steps, cap)) + CLIENT_OVERHEAD_STEPS
    return costs


def shard(sizes: Mapping[int, int], num_shards: int) -> list[list[int]]:
    """Clients -> shards with near-equal totals of `sizes` (a client's samples, or its cost:
    `client_costs`), the largest first onto the lightest shard.

    Deterministic: ties go to the lower client id and the lower shard. Each shard is sorted.
    """
    loads = [0] * num_shards
    shards: list[list[int]] = [[] for _ in range(num_shards)]
    for cid in sorted(sizes, key=lambda c: (-sizes[c], c)):
        target = min(range(num_shards), key=lambda s: (loads[s], s))
        shards[target].append(cid)
        loads[target] += sizes[cid]
    return [sorted(s) for s in shards]


class WorkerFailed(RuntimeError):
    """A worker process raised, or died, while it trained its shard."""


class PoolExecutor:
    """The sequential executor's training, the cohort sharded over `workers` processes (this one
    and `workers` - 1 forked ones); `threads`: torch's threads in each."""

    def __init__(self, workers: int, threads: int = 1):
        # torch imports its compiler stack on an optimizer's first construction (seconds): here,
        # with the run's start-up, so that the workers inherit it instead of importing it again
        torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
        self.workers = int(workers)
        self.threads = int(threads)
        self.inner = SequentialExecutor()
        self._conns: list = []
        self._procs: list = []
        self._bound: tuple[int, int] | None = None  # ids of the algorithm and data forked with
        self._finalizer = None

    # ---- the workers ---------------------------------------------------------------------------
    def _start(self, algorithm: Algorithm, data) -> None:
        context = multiprocessing.get_context("fork")
        sys.stdout.flush()  # a forked child must not write the parent's buffered output again
        sys.stderr.flush()
        parent = os.getpid()
        for _ in range(self.workers - 1):
            mine, theirs = context.Pipe()
            proc = context.Process(
                target=_serve,
                args=(theirs, mine, algorithm, data, self.threads, parent),
                daemon=True,
            )
            proc.start()
            theirs.close()
            self._conns.append(mine)
            self._procs.append(proc)
        self._bound = (id(algorithm), id(data))
        self._finalizer = weakref.finalize(self, _stop, self._conns, self._procs)
        log.info("executor: %d worker processes started", len(self._procs))

    def close(self) -> None:
        """Stop the workers (a later round starts them again)."""
        if self._finalizer is not None:
            self._finalizer()
        self._conns, self._procs, self._bound, self._finalizer = [], [], None, None

    # ---- a round -------------------------------------------------------------------------------
    def run(
        self,
        algorithm: Algorithm,
        payloads: Mapping[int, Message],
        ctx: RoundContext,
        data,
        stats: torch.Tensor | None = None,
    ) -> RoundResults:
        """The round's clients, sharded over the processes; the results in `ctx`'s order."""
        if self.workers < 2 or len(ctx.client_ids) < 2:
            return self.inner.run(algorithm, payloads, ctx, data, stats)
        if self._bound is None:
            self._start(algorithm, data)
        elif self._bound != (id(algorithm), id(data)):  # another algorithm or data: here
            return self.inner.run(algorithm, payloads, ctx, data, stats)
        shards = shard(client_costs(algorithm, ctx, data), self.workers)
        store = algorithm.store
        replies: list = []
        for w, (conn, ids) in enumerate(zip(self._conns, shards[1:]), start=1):
            if ids:
                entries = {cid: store.get(cid) for cid in ids}
                sub = RoundContext(ctx.round, tuple(ids), ctx.seed, ctx.num_malicious)
                conn.send((sub, {c: payloads[c] for c in ids}, stats, entries))
                # taken off the pipe while this process trains its own shard: a worker done
                # first hands over its results at once instead of waiting on a full pipe
                replies.append(_Reply(w, conn))
        parts = []
        if shards[0]:
            sub = RoundContext(ctx.round, tuple(shards[0]), ctx.seed, ctx.num_malicious)
            try:
                parts.append(self.inner.run(algorithm, payloads, sub, data, stats))
            except BaseException:
                self.close()  # the workers stop once they have replied; the run stops here
                raise
        for reply in replies:
            results, entries = self._receive(reply)
            for cid, entry in entries.items():
                if entry is None:
                    store.delete(cid)
                else:
                    store.put(cid, entry)
            parts.append(results)
        return RoundResults.concat(parts).take(ctx.client_ids)

    def _receive(self, reply: _Reply):
        w, message = reply.w, reply.wait()
        if message is None:
            code = self._procs[w - 1].exitcode
            self.close()
            raise WorkerFailed(f"executor: worker process {w} died (exit code {code})")
        if message[0] == "error":
            self.close()
            log.error("worker process %d:\n%s", w, message[2])
            raise WorkerFailed(f"executor: worker process {w} failed: {message[1]}")
        return message[1], message[2]

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        del state


class _Reply:
    """A worker's reply to this round's shard, received by a thread of its own."""

    def __init__(self, w: int, conn):
        self.w = w
        self._message = None
        self._thread = threading.Thread(target=self._take, args=(conn,), daemon=True)
        self._thread.start()

    def _take(self, conn) -> None:
        with contextlib.suppress(EOFError, OSError):  # the worker died: None
            self._message = conn.recv()

    def wait(self):
        """The worker's message: ("ok", results, entries) or ("error", text, traceback); None
        if it died."""
        self._thread.join()
        return self._message


def _stop(conns, procs) -> None:
    for conn in conns:
        try:
            conn.send(None)
            conn.close()
        except (OSError, ValueError):
            pass
    for proc in procs:
        proc.join(timeout=5)
        if proc.is_alive():
            proc.kill()
            proc.join(timeout=5)


def _die_with_parent(parent: int) -> None:
    """Have the kernel kill this process when its parent dies (Linux), or leave now if the
    parent is already gone."""
    with contextlib.suppress(OSError, AttributeError):  # not Linux: the closed pipe ends it
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        os._exit(0)


def _serve(conn, parent_end, algorithm: Algorithm, data, threads: int, parent: int) -> None:
    """A worker's loop: a shard in, its results and store entries out, until the parent says
    stop or goes away."""
    parent_end.close()  # only the parent holds its end: when it exits, recv ends here
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles the stop signals
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _die_with_parent(parent)
    torch.set_num_threads(threads)
    algorithm.store = ClientStore()  # this round's entries only, in memory: no shared spill dir
    executor = SequentialExecutor()
    code = 0
    try:
        while True:
            try:
                task = conn.recv()
            except (EOFError, OSError):
                break
            if task is None:
                break
            ctx, payloads, stats, entries = task
            algorithm.store.load_state_dict({c: e for c, e in entries.items() if e is not None})
            try:
                results = executor.run(algorithm, payloads, ctx, data, stats)
                left = {c: algorithm.store.get(c) for c in ctx.client_ids}
                conn.send(("ok", results, left))
            except Exception as err:  # noqa: BLE001 - the parent raises it
                conn.send(("error", f"{type(err).__name__}: {err}", traceback.format_exc()))
    except BaseException:  # noqa: BLE001 - a worker never runs the parent's handlers
        code = 1
    finally:
        os._exit(code)
