"""What the pool executor's processes send each other through their pipes, and the torchrun ranks
through their round's collective: pickles whose plain CPU tensors travel as their bytes (`send`,
`receive`, `dumps`).

Through a pipe, a message is one frame: its length, then the pickle with its tensors' bytes out
of band (pickle protocol 5), each at an offset aligned for any dtype. The reader takes the frame
from the socket into one buffer, and the tensors it unpickles are views of that buffer: one copy
from the kernel, where `multiprocessing`'s `recv_bytes` and an in-band pickle made four (its
chunks, their join, the bytes object, the pickle's own copy of each tensor) — a third of a
millisecond of the run's process a worker's result, taken from its own training."""

from __future__ import annotations

import io
import os
import pickle
import struct

import torch

ALIGN = 64  # a tensor's bytes start at a multiple of this within a frame
_U64 = struct.Struct("<Q")
IOV_MAX = 512  # buffers a writev takes at once (Linux allows 1024)


def dumps(message) -> memoryview:
    """`message` pickled, its tensors as their bytes (`_Pickler`); `pickle.loads` reads it."""
    out = io.BytesIO()
    _Pickler(out, protocol=5).dump(message)
    return out.getbuffer()


def frame(message) -> list[memoryview]:
    """`message` as the pieces of one frame (`receive` reads it): its length; the number of
    out-of-band buffers, the pickle's length and each buffer's; the pickle; each buffer, padded
    to `ALIGN`. The buffers are the tensors' own bytes, not copies."""
    raws: list[memoryview] = []
    out = io.BytesIO()
    _Pickler(out, protocol=5, buffer_callback=lambda b: raws.append(b.raw())).dump(message)
    head = out.getbuffer()
    sizes = [r.nbytes for r in raws]
    meta = struct.pack(f"<QQ{len(sizes)}Q", len(sizes), head.nbytes, *sizes)
    pieces, at = [memoryview(meta), head], len(meta) + head.nbytes
    for raw in raws:
        pad = -at % ALIGN
        if pad:
            pieces.append(memoryview(bytes(pad)))
            at += pad
        pieces.append(raw)
        at += raw.nbytes
    return [memoryview(_U64.pack(at)), *pieces]


def send(conn, message) -> None:
    """`message` through the pipe as one frame (`frame`), straight from its tensors' bytes."""
    _write(conn.fileno(), frame(message))


def write_frame(conn, pieces: list[memoryview]) -> None:
    """A frame built once (`frame`) through the pipe: one message to several readers."""
    _write(conn.fileno(), list(pieces))


def receive(conn):
    """The next frame from the pipe, unpickled; its tensors are views of the one buffer the
    frame was read into. EOFError once the other side has gone."""
    fd = conn.fileno()
    (size,) = _U64.unpack(_read(fd, bytearray(_U64.size)))
    return unframe(_read(fd, bytearray(size)))


def unframe(data: bytearray):
    """A frame's body (all but its length) unpickled; its tensors are views of `data`."""
    view = memoryview(data)
    count, head = _U64.unpack_from(data, 0)[0], _U64.unpack_from(data, 8)[0]
    sizes = struct.unpack_from(f"<{count}Q", data, 16)
    at = 16 + 8 * count
    pickled, at = view[at : at + head], at + head
    buffers = []
    for n in sizes:
        at += -at % ALIGN
        buffers.append(view[at : at + n])
        at += n
    return pickle.loads(pickled, buffers=buffers)


def put_in_space(space, message) -> int | None:
    """`message`'s frame body written into `space` (a shared memory map) from its start: its
    length in bytes, or None where it does not fit (nothing written)."""
    body = _byte_views(frame(message)[1:])
    size = sum(p.nbytes for p in body)
    if size > len(space):
        return None
    at = 0
    for piece in body:
        space[at : at + piece.nbytes] = piece
        at += piece.nbytes
    return size


def take_from_space(space, size: int):
    """The message `put_in_space` left in `space` (`size` bytes), copied out once and unpickled:
    its tensors own their bytes, whatever is written there next."""
    data = bytearray(size)
    with memoryview(space) as view:
        data[:] = view[:size]
    return unframe(data)


def _byte_views(pieces: list[memoryview]) -> list[memoryview]:
    """The non-empty pieces as flat views of bytes."""
    return [p.cast("B") if p.format != "B" or p.ndim != 1 else p for p in pieces if p.nbytes]


def _write(fd: int, pieces: list[memoryview]) -> None:
    pieces = _byte_views(pieces)
    first = 0
    while first < len(pieces):
        written = os.writev(fd, pieces[first : first + IOV_MAX])
        while written:
            if written >= pieces[first].nbytes:
                written -= pieces[first].nbytes
                first += 1
            else:
                pieces[first] = pieces[first][written:]
                written = 0


def _read(fd: int, into: bytearray) -> bytearray:
    view, at = memoryview(into), 0
    while at < len(into):
        got = os.readv(fd, [view[at:]])
        if got == 0:
            raise EOFError("the other side closed the pipe")
        at += got
    return into


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
