"""What the pool executor's processes send each other through their pipes, and the torchrun ranks
through their round's collective: pickles whose plain CPU tensors travel as their bytes (`send`,
`receive`, `dumps`)."""

from __future__ import annotations

import io
import pickle

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
