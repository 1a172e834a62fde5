"""A round's cohort trained over the machine's cores: W processes, one run (`executor=auto` on a
CPU with cores to spare; `fedexp.engine.executors.select` decides).

The run's process forks W - 1 workers before its first round (`start`; Python's
`multiprocessing`, fork start method): each inherits the built experiment — the algorithm, its
client modules and the data — as the parent's own memory pages, shared copy-on-write (the data's
tensors are never written, so they are never copied), and one counter in shared memory.

A round is one message to each worker and one back, and nothing between: no thread in any
process, no wake-up while the clients train. The message holds the round's context and
statistics and its clients, largest first (by expected optimizer steps, `client_costs`), each
with its payload and store entry (pickled once however many clients share it: FedAvg's global
model goes once). Each process, the parent included, then claims the next client from the
shared counter (a lock held for a few instructions) until none is left, so a process that runs
slower (a busy or throttled core) takes fewer clients, where fixed shards made the round wait
for the slowest. A worker sends back its clients' results and the store entries they left once
the counter runs out, into shared memory of its own (a map made before the fork, through
the pipe only where they do not fit: a socket's buffer holds about a tenth of a worker's share
of a 20-client round's uploads, so the two processes would take turns); the parent reads them
after its own clients.
Where every worker receiving every client would move too much (`broadcast`: more than
`SHARED_LIMIT` bytes a round over all workers, and more than `SHARED_OVER_FIXED` times what fixed
shards move: large per-client entries, many workers), each process gets a fixed shard instead
(`shard`: near-equal expected steps), with only its own clients' payloads and entries.
Each client trains exactly as in the sequential executor (`run_client`: seeds from (seed, round,
client), the same thread count), so the results are the sequential executor's, bit for bit,
whoever trains them.

Only the parent runs the round loop: sampling, aggregation, evaluation, checkpoints, signals,
loggers and the run-dir lock stay where they are. Workers ignore SIGINT and SIGTERM (the parent
finishes its round and stops them), die with the parent (PR_SET_PDEATHSIG, and a pipe that
closes), and leave with `os._exit`, running none of the parent's exit handlers.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import mmap
import multiprocessing
import os
import signal
import sys
import traceback
import weakref
from collections.abc import Mapping

import torch

from fedexp.core.algorithm import Algorithm
from fedexp.core.client_store import ClientStore
from fedexp.core.cohort import RoundResults
from fedexp.core.types import Message, RoundContext
from fedexp.engine.executors.sequential import SequentialExecutor
from fedexp.engine.executors.wire import (
    frame,
    put_in_space,
    receive,
    send,
    take_from_space,
    write_frame,
)

log = logging.getLogger(__name__)
PR_SET_PDEATHSIG = 1  # prctl(2): the signal a process gets when its parent dies
# every worker gets every client's payload and store entry (the processes claim clients from the
# shared counter) where that moves at most SHARED_LIMIT bytes a round over all workers, or at
# most SHARED_OVER_FIXED times what fixed shards would (a payload the cohort shares goes to each
# worker either way); otherwise each process gets a fixed shard (`shard`) and only its clients
SHARED_LIMIT = 64 * 2**20
SHARED_OVER_FIXED = 2.0
# how long a process waits for the shared counter's lock before it takes a worker for dead
# (held for a few instructions; a worker killed while it held it would hold it for good)
CLAIM_TIMEOUT_S = 60.0
# shared memory a worker writes its round's results into (its pages are taken only as written);
# larger results go through the pipe, whose small buffer makes both processes take turns
RESULT_SPACE = 64 * 2**20


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


def broadcast(message_bytes: int, workers: int, fixed_bytes) -> bool:
    """Whether a round goes to every worker whole (`message_bytes` each, to `workers` workers)
    rather than in fixed shards (`fixed_bytes()`: what they would send in all, computed only
    when the whole round is over `SHARED_LIMIT`)."""
    total = message_bytes * workers
    return total <= SHARED_LIMIT or total <= SHARED_OVER_FIXED * fixed_bytes()


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
    """A worker process raised, or died, during a round (or held the shared counter too long)."""


class PoolExecutor:
    """The sequential executor's training, the cohort spread over `workers` processes (this one
    and `workers` - 1 forked ones); `threads`: torch's threads in each."""

    def __init__(self, workers: int, threads: int = 1):
        self.workers = int(workers)
        self.threads = int(threads)
        self.inner = SequentialExecutor()
        self._conns: list = []
        self._procs: list = []
        self._spaces: list[mmap.mmap] = []  # where each worker leaves its round's results
        self._counter: _Counter | None = None
        self._bound: tuple[int, int] | None = None  # ids of the algorithm and data forked with
        self._finalizer = None
        self.last_round_shared: bool | None = None  # whole to every worker, or fixed shards

    # ---- the workers ---------------------------------------------------------------------------
    def start(self, algorithm: Algorithm, data) -> None:
        """Fork the workers now, before the first round (the orchestrator calls it once the run
        is built, its checkpoint restored): the fork is the run's start-up, as a Ray cluster's
        is Flower's, not its first round's time. A round starts them if nobody did."""
        if self.workers >= 2 and self._bound is None:
            self._start(algorithm, data)

    def _start(self, algorithm: Algorithm, data) -> None:
        context = multiprocessing.get_context("fork")
        sys.stdout.flush()  # a forked child must not write the parent's buffered output again
        sys.stderr.flush()
        parent = os.getpid()
        self._counter = _Counter(context)
        for _ in range(self.workers - 1):
            mine, theirs = context.Pipe()
            space = mmap.mmap(-1, RESULT_SPACE)  # shared and anonymous: the fork keeps it
            args = (theirs, mine, algorithm, data, self.threads, parent, self._counter, space)
            proc = context.Process(target=_serve, args=args, daemon=True)
            proc.start()
            theirs.close()
            self._conns.append(mine)
            self._procs.append(proc)
            self._spaces.append(space)
        self._bound = (id(algorithm), id(data))
        self._finalizer = weakref.finalize(self, _stop, self._conns, self._procs, self._spaces)
        log.info("executor: %d worker processes started", len(self._procs))

    def close(self) -> None:
        """Stop the workers (a later round starts them again)."""
        if self._finalizer is not None:
            self._finalizer()
        self._conns, self._procs, self._spaces = [], [], []
        self._counter, self._bound, self._finalizer = None, None, None

    # ---- a round -------------------------------------------------------------------------------
    def run(
        self,
        algorithm: Algorithm,
        payloads: Mapping[int, Message],
        ctx: RoundContext,
        data,
        stats: torch.Tensor | None = None,
    ) -> RoundResults:
        """The round's clients, claimed by the processes; the results in `ctx`'s order."""
        if self.workers < 2 or len(ctx.client_ids) < 2:
            return self.inner.run(algorithm, payloads, ctx, data, stats)
        if self._bound is None:
            self._start(algorithm, data)
        elif self._bound != (id(algorithm), id(data)):  # another algorithm or data: here
            return self.inner.run(algorithm, payloads, ctx, data, stats)
        store = algorithm.store
        costs = client_costs(algorithm, ctx, data)
        order = sorted(ctx.client_ids, key=lambda c: (-costs[c], c))
        mine = self._send_round(ctx, stats, order, costs, payloads, store)
        parts = []
        try:
            for cid in mine:
                sub = RoundContext(ctx.round, (cid,), ctx.seed, ctx.num_malicious)
                parts.append(self.inner.run(algorithm, payloads, sub, data, stats))
        except BaseException:
            self.close()  # the workers stop once they have replied; the run stops here
            raise
        for w, conn in enumerate(self._conns, start=1):
            results, left = self._receive(w, conn)
            for cid, entry in left.items():
                if entry is None:
                    store.delete(cid)
                else:
                    store.put(cid, entry)
            parts.extend(results)
        at = {cid: i for i, cid in enumerate(ctx.client_ids)}  # in order: no reordering copy
        parts.sort(key=lambda part: at[part.client_ids[0]])
        return RoundResults.concat(parts).take(ctx.client_ids)

    def _send_round(self, ctx, stats, order, costs, payloads, store):
        """Each worker's message of the round; the clients this process trains (an iterator:
        claimed from the shared counter as it goes, or its fixed shard)."""
        head = (ctx.round, ctx.seed, ctx.num_malicious, stats)
        entries = {cid: store.get(cid) for cid in order}
        every = frame((*head, [(c, payloads[c], entries[c]) for c in order], True))
        shards, fixed = [], []

        def fixed_bytes() -> int:  # each worker's shard framed (kept: sent if they win)
            shards.extend(
                sorted(s, key=lambda c: (-costs[c], c)) for s in shard(costs, self.workers)
            )
            for clients in shards[1:]:
                fixed.append(frame((*head, [(c, payloads[c], entries[c]) for c in clients], False)))
            return sum(_nbytes(pieces) for pieces in fixed)

        self.last_round_shared = broadcast(_nbytes(every), len(self._conns), fixed_bytes)
        if self.last_round_shared:
            self._counter.reset()
            for conn in self._conns:
                write_frame(conn, every)
            return (order[i] for i in self._counter.claims(len(order)))
        for conn, pieces in zip(self._conns, fixed, strict=True):
            write_frame(conn, pieces)
        return iter(shards[0])

    def _receive(self, w: int, conn):
        try:
            message = receive(conn)
        except (EOFError, OSError):
            code = self._procs[w - 1].exitcode
            self.close()
            raise WorkerFailed(f"executor: worker process {w} died (exit code {code})") from None
        if message[0] == "in space":  # the results are in the worker's shared memory
            message = take_from_space(self._spaces[w - 1], message[1])
        if message[0] == "error":
            self.close()
            log.error("worker process %d:\n%s", w, message[2])
            raise WorkerFailed(f"executor: worker process {w} failed: {message[1]}")
        return message[1], message[2]

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        del state


class _Counter:
    """The round's next client, an index in shared memory that every process claims from under
    one lock (`multiprocessing`'s, made before the fork: the workers inherit both)."""

    def __init__(self, context):
        self._value = context.RawValue("q", 0)
        self._lock = context.Lock()

    def reset(self) -> None:
        with self._lock:
            self._value.value = 0

    def claims(self, n: int):
        """The indices this process claims, one at a time, until all `n` are taken."""
        while True:
            if not self._lock.acquire(timeout=CLAIM_TIMEOUT_S):
                raise WorkerFailed("executor: a worker process holds the round's counter")
            try:
                i = self._value.value
                self._value.value = i + 1
            finally:
                self._lock.release()
            if i >= n:
                return
            yield i


def _nbytes(pieces) -> int:
    return sum(piece.nbytes for piece in pieces)


def _stop(conns, procs, spaces) -> None:
    """Tell each worker to stop, without waiting on a pipe it does not read (a worker stuck in
    a send, its pipe full); a worker still there 5 s later is killed."""
    for conn in conns:
        with contextlib.suppress(OSError, ValueError):
            os.set_blocking(conn.fileno(), False)
            send(conn, None)
        with contextlib.suppress(OSError, ValueError):
            conn.close()
    for proc in procs:
        proc.join(timeout=5)
        if proc.is_alive():
            proc.kill()
            proc.join(timeout=5)
    for space in spaces:
        space.close()


def _die_with_parent(parent: int) -> None:
    """Have the kernel kill this process when its parent dies (Linux), or leave now if the
    parent is already gone."""
    with contextlib.suppress(OSError, AttributeError):  # not Linux: the closed pipe ends it
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        os._exit(0)


def _serve(conn, parent_end, algorithm: Algorithm, data, threads: int, parent: int, counter, space):
    """A worker's loop: a round's clients in, its results and store entries out, until the
    parent says stop or goes away."""
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
                task = receive(conn)
            except (EOFError, OSError):
                break
            if task is None:
                break
            try:
                results = _train_round(algorithm, executor, data, counter, task)
                size = put_in_space(space, results)
                send(conn, results if size is None else ("in space", size))
            except (EOFError, OSError):  # the parent went away
                break
            except Exception as err:  # noqa: BLE001 - the parent raises it and stops the pool
                send(conn, ("error", f"{type(err).__name__}: {err}", traceback.format_exc()))
                break
    except BaseException:  # noqa: BLE001 - a worker never runs the parent's handlers
        code = 1
    finally:
        os._exit(code)


def _train_round(algorithm: Algorithm, executor, data, counter: _Counter, task) -> tuple:
    """A worker's round: the clients it claims from the shared counter (or its fixed shard),
    each trained on the entry it was sent; ("end", their results, the entries they left)."""
    round_idx, seed, num_malicious, stats, clients, shared = task
    store = algorithm.store = ClientStore()  # this round's entries only, in memory
    claimed = (clients[i] for i in counter.claims(len(clients))) if shared else iter(clients)
    parts, left = [], {}
    for cid, payload, entry in claimed:
        if entry is not None:
            store.put(cid, entry)
        ctx = RoundContext(round_idx, (cid,), seed, num_malicious)
        parts.append(executor.run(algorithm, {cid: payload}, ctx, data, stats))
        left[cid] = store.get(cid)
        store.delete(cid)
    return ("end", parts, left)
