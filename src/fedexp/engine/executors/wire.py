"""What the pool executor's processes send each other through their pipes, and the torchrun ranks
through their round's collective: pickles whose plain CPU tensors travel as their bytes (`send`,
`receive`, `dumps`)."""

from __future__ import annotations

import io
import pickle
import queue
import threading

import torch


def dumps(message) -> memoryview:
    """`message` pickled, its tensors as their bytes (`_Pickler`); `pickle.loads` reads it."""
    out = io.BytesIO()
    _Pickler(out, protocol=5).dump(message)
    return out.getbuffer()


def send(conn, message) -> None:
    """`message` through the pipe, its tensors as their bytes."""
    conn.send_bytes(dumps(message))


def receive(conn):
    return pickle.loads(conn.recv_bytes())


class Sender:
    """A process's sends through `conn`, in order, from a thread of its own: `put` pickles the
    message (in the caller's thread: the bytes are what the message held then) and returns.
    A message larger than the pipe holds (a 0.2 MB upload) waits in a plain send until the
    other side reads it; a pool worker's reader is a thread of the run's process, which waits
    for the interpreter's lock behind that process's training: 0.6 ms a client, measured, that
    the worker now spends training its next client. Reading from `conn` stays the caller's."""

    def __init__(self, conn):
        self._conn = conn
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._failed: BaseException | None = None
        self._thread = threading.Thread(target=self._drain, name="sender", daemon=True)
        self._thread.start()

    def put(self, message) -> None:
        if self._failed is not None:  # the pipe broke: the caller's loop ends as with a send
            raise self._failed
        self._queue.put(dumps(message))

    def flush(self) -> None:
        """Wait until every message put so far is in the pipe."""
        done = threading.Event()
        self._queue.put(done)
        done.wait()
        if self._failed is not None:
            raise self._failed

    def _drain(self) -> None:
        while True:
            item = self._queue.get()
            if isinstance(item, threading.Event):
                item.set()
                continue
            if self._failed is None:
                try:
                    self._conn.send_bytes(item)
                except (OSError, EOFError) as err:  # the other side went away
                    self._failed = err


class _Pickler(pickle.Pickler):
    """Pickles a plain CPU tensor as its bytes, read back into a tensor that owns them. (Through
    `multiprocessing`'s own pickler, torch moves every tensor sent into a shared-memory file and
    the receiver fetches its descriptor from a thread of the sender's, one exchange a tensor: a
    worker started its shard tens of milliseconds after the parent, whose training held that
    thread off the interpreter's lock.)"""

    def reducer_override(self, obj):
        if (
            type(obj) is not torch.Tensor
            or obj.device.type != "cpu"
            or obj.requires_grad
            or obj.layout != torch.strided
            or obj.is_conj()
            or obj.is_neg()
            or obj.numel() == 0
        ):
            return NotImplemented  # torch's own pickling
        raw = obj.detach().contiguous().reshape(-1).view(torch.uint8).numpy()
        return _tensor, (pickle.PickleBuffer(raw), obj.dtype, tuple(obj.shape))


def _tensor(raw: bytearray, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    """A tensor over `raw`'s bytes (a writable buffer that the tensor keeps alive)."""
    return torch.frombuffer(raw, dtype=torch.uint8).view(dtype).reshape(shape)
