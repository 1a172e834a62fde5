"""A round's cohort trained over the machine's cores: W processes, one run (`executor=auto` on a
CPU with cores to spare; `fedexp.engine.executors.select` decides).

The run's process forks W - 1 workers before its first round (`start`; Python's
`multiprocessing`, fork start method): each inherits the built experiment — the algorithm, its
client modules and the data — as the parent's own memory pages, shared copy-on-write (the data's
tensors are never written, so they are never copied). Each round, the clients are handed out one
at a time, the largest first (by expected optimizer steps, `client_costs`), to whichever process
is free: the parent takes the next one itself between its clients, and a thread of the parent's
per worker answers that worker's requests through its pipe with a client's payload and store
entry (the round's context and broadcast statistics go once, with the worker's first client).
A worker asks for its next client before it trains the one in hand, so it never waits on the
parent; once fewer clients are left than processes, it asks only when free. Each client's
results and the store entry it left come back as soon as it is trained. So a process that
runs slower (a busy or throttled core) takes fewer clients, where fixed shards made the round
wait for the slowest. Each client trains
exactly as in the sequential executor (`run_client`: seeds from (seed, round, client), the same
thread count), so the results are the sequential executor's, bit for bit, whoever trains them.

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
from fedexp.engine.executors.wire import Sender, receive, send

log = logging.getLogger(__name__)
PR_SET_PDEATHSIG = 1  # prctl(2): the signal a process gets when its parent dies
# the answer to a worker that asks for its next client while it trains one, once fewer clients
# are left than processes: ask again when free (the last clients go one to a process)
LATER = "later"
# in place of a client's payload: the same object as the last one sent to that worker this round
# (FedAvg-like algorithms send every client one payload: the global model goes once a worker)
SAME = "same payload"


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
    """The sequential executor's training, the cohort spread over `workers` processes (this one
    and `workers` - 1 forked ones); `threads`: torch's threads in each."""

    def __init__(self, workers: int, threads: int = 1):
        self.workers = int(workers)
        self.threads = int(threads)
        self.inner = SequentialExecutor()
        self._conns: list = []
        self._procs: list = []
        self._bound: tuple[int, int] | None = None  # ids of the algorithm and data forked with
        self._finalizer = None

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
        """The round's clients, handed out over the processes; the results in `ctx`'s order."""
        if self.workers < 2 or len(ctx.client_ids) < 2:
            return self.inner.run(algorithm, payloads, ctx, data, stats)
        if self._bound is None:
            self._start(algorithm, data)
        elif self._bound != (id(algorithm), id(data)):  # another algorithm or data: here
            return self.inner.run(algorithm, payloads, ctx, data, stats)
        costs = client_costs(algorithm, ctx, data)
        queue = _Queue(sorted(ctx.client_ids, key=lambda c: (-costs[c], c)))
        store = algorithm.store
        entries = {cid: store.get(cid) for cid in ctx.client_ids}  # read here, not in threads
        dispatchers = [
            _Dispatcher(w, self.workers, conn, queue, ctx, payloads, stats, entries)
            for w, conn in enumerate(self._conns, start=1)
        ]
        for dispatcher in dispatchers:  # each worker has its first client before this one trains
            dispatcher.started.wait()
        parts = []
        try:
            while (cid := queue.pop()) is not None:
                sub = RoundContext(ctx.round, (cid,), ctx.seed, ctx.num_malicious)
                parts.append(self.inner.run(algorithm, payloads, sub, data, stats))
        except BaseException:
            self.close()  # the workers stop once they have replied; the run stops here
            raise
        for dispatcher in dispatchers:
            results, left = self._receive(dispatcher)
            for cid, entry in left.items():
                if entry is None:
                    store.delete(cid)
                else:
                    store.put(cid, entry)
            parts.extend(results)
        at = {cid: i for i, cid in enumerate(ctx.client_ids)}  # in order: no reordering copy
        parts.sort(key=lambda part: at[part.client_ids[0]])
        return RoundResults.concat(parts).take(ctx.client_ids)

    def _receive(self, dispatcher: _Dispatcher):
        w, message = dispatcher.w, dispatcher.wait()
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


class _Queue:
    """The round's clients not yet handed out, largest first; taken one at a time by this
    process's loop and by the dispatchers' threads."""

    def __init__(self, order: list[int]):
        self._order = order
        self._next = 0
        self._lock = threading.Lock()

    def left(self) -> int:
        with self._lock:
            return len(self._order) - self._next

    def pop(self) -> int | None:
        with self._lock:
            if self._next == len(self._order):
                return None
            self._next += 1
            return self._order[self._next - 1]


class _Dispatcher:
    """A thread that serves one worker through the round: the round's context with its first
    client (`started` is set once it is sent: the run's process waits for it before it trains,
    so the worker starts at once instead of when this thread next gets the interpreter's lock
    from that training), then a client from the queue at each of the worker's requests (its
    payload and store entry), then the worker's results."""

    def __init__(
        self,
        w: int,
        processes: int,
        conn,
        queue: _Queue,
        ctx: RoundContext,
        payloads,
        stats,
        entries,
    ):
        self.w = w
        self._processes = processes
        self._message = None
        self.started = threading.Event()
        args = (conn, queue, ctx, payloads, stats, entries)
        self._thread = threading.Thread(target=self._serve, args=args, daemon=True)
        self._thread.start()

    def _serve(self, conn, queue, ctx, payloads, stats, entries) -> None:
        parts, left, last = [], {}, None

        def hand_out():  # the queue's next client, its payload sent once to this worker
            nonlocal last
            if (cid := queue.pop()) is None:
                return None
            payload, same = payloads[cid], payloads[cid] is last
            last = payload
            return cid, SAME if same else payload, entries[cid]

        with contextlib.suppress(EOFError, OSError):  # the worker died: None
            try:
                send(conn, (ctx.round, ctx.seed, ctx.num_malicious, stats, hand_out()))
            finally:
                self.started.set()
            while (message := receive(conn))[0] in ("next", "trained"):
                if message[0] == "trained":  # a client's results, as soon as it is done
                    _, cid, results, left[cid] = message
                    parts.append(results)
                elif message[1] and queue.left() < self._processes:  # the last few: one each
                    send(conn, LATER)
                else:
                    send(conn, hand_out())
            self._message = ("ok", parts, left) if message[0] == "end" else message

    def wait(self):
        """("ok", the worker's clients' results, the store entries they left), or ("error",
        text, traceback); None if the worker died."""
        self._thread.join()
        return self._message


def _stop(conns, procs) -> None:
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
    executor, sender = SequentialExecutor(), Sender(conn)
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
                _train_handed_out(conn, sender, algorithm, executor, data, task)
            except (EOFError, OSError):  # the parent went away
                break
            except Exception as err:  # noqa: BLE001 - the parent raises it and stops the pool
                sender.put(("error", f"{type(err).__name__}: {err}", traceback.format_exc()))
                sender.flush()
                break
    except BaseException:  # noqa: BLE001 - a worker never runs the parent's handlers
        code = 1
    finally:
        os._exit(code)


def _train_handed_out(conn, sender: Sender, algorithm: Algorithm, executor, data, task) -> None:
    """A worker's round: the clients the parent hands out, one at a time (the next asked for
    before this one trains, so none waits on the parent's thread), each one's results and the
    store entry it left sent back as soon as it is trained (by `sender`'s thread, while this
    one trains the next client)."""
    round_idx, seed, num_malicious, stats, handed = task  # the round's first client with it
    store = algorithm.store = ClientStore()  # this round's entries only, in memory
    last = None
    while handed is not None:
        if handed == LATER:  # asked while busy, with few clients left: ask again now
            sender.put(("next", False))
            handed = receive(conn)
            continue
        cid, payload, entry = handed
        payload = last = last if isinstance(payload, str) else payload  # SAME: the last one
        sender.put(("next", True))
        if entry is not None:
            store.put(cid, entry)
        ctx = RoundContext(round_idx, (cid,), seed, num_malicious)
        results = executor.run(algorithm, {cid: payload}, ctx, data, stats)
        # this thread reads the answer while the sender's writes: neither side's thread ever
        # waits to send to one that is itself sending (a deadlock once both outgrow the pipe)
        handed = receive(conn)
        sender.put(("trained", cid, results, store.get(cid)))
        store.delete(cid)
    sender.put(("end",))
