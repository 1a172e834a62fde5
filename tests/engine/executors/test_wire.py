"""The pool's pipe messages (`engine/executors/wire.py`): tensors as their bytes, one frame
built once for several readers."""

from __future__ import annotations

import multiprocessing
import pickle
import threading

import pytest
import torch

from fedexp.engine.executors.wire import IOV_MAX, dumps, frame, receive, send, write_frame


def test_tensors_travel_as_their_bytes_with_dtype_and_shape():
    message = {"w": torch.arange(6.0).reshape(2, 3), "h": torch.ones(2).half(), "n": 3}
    back = pickle.loads(dumps(message))
    assert torch.equal(back["w"], message["w"]) and back["h"].dtype == torch.float16
    assert back["n"] == 3
    back["w"][0, 0] = 7.0  # the tensor read back owns its bytes
    assert message["w"][0, 0] == 0.0


def test_a_frame_carries_every_kind_of_tensor_aligned_and_apart():
    mine, theirs = multiprocessing.Pipe()
    grad = torch.ones(3, requires_grad=True)  # through torch's own pickling
    message = {
        "half": torch.arange(3).half(),  # 6 bytes: the next tensor starts at a padded offset
        "long": torch.arange(5, dtype=torch.int64),
        "mask": torch.tensor([True, False, True]),
        "double": torch.arange(12.0, dtype=torch.float64).reshape(3, 4).t(),  # not contiguous
        "empty": torch.zeros(0, 2),
        "grad": grad,
        "text": "kept",
    }
    send(mine, message)
    back = receive(theirs)
    for name in ("half", "long", "mask", "double", "empty"):
        assert back[name].dtype == message[name].dtype, name
        assert torch.equal(back[name], message[name]), name
    assert back["grad"].requires_grad and torch.equal(back["grad"], grad)
    assert back["text"] == "kept"
    for name in ("half", "long", "mask", "double"):
        assert back[name].data_ptr() % 8 == 0, name  # any dtype reads its elements aligned
    back["half"].fill_(9)  # each tensor its own bytes of the frame: the others stay
    assert back["long"].tolist() == [0, 1, 2, 3, 4] and back["mask"].tolist() == [1, 0, 1]


def test_a_frame_of_more_buffers_than_one_write_takes_arrives_whole():
    mine, theirs = multiprocessing.Pipe()
    message = [torch.full((7,), float(i)) for i in range(IOV_MAX * 2 + 3)]
    assert len(frame(message)) > IOV_MAX * 2 + 3  # one piece a tensor: several writes
    box = []
    reader = threading.Thread(target=lambda: box.append(receive(theirs)), daemon=True)
    reader.start()  # read while it is written: more than a pipe holds at once
    send(mine, message)
    reader.join(timeout=30)
    assert [t[0].item() for t in box[0]] == [float(i) for i in range(len(message))]


def test_receive_says_eof_once_the_other_side_has_gone():
    mine, theirs = multiprocessing.Pipe()
    send(mine, ("last", torch.ones(2)))
    mine.close()
    assert receive(theirs)[0] == "last"
    with pytest.raises(EOFError):
        receive(theirs)


def test_one_frame_written_to_two_pipes_reads_back_whole_in_each_with_a_shared_tensor_once():
    shared = torch.arange(10_000, dtype=torch.float32)  # 40 kB, in the message three times
    message = [(cid, shared) for cid in range(3)]
    pieces = frame(message)
    assert sum(p.nbytes for p in pieces) < 2 * shared.nbytes  # pickled once, referred to twice
    pipes = [multiprocessing.Pipe() for _ in range(2)]
    for mine, _ in pipes:
        write_frame(mine, pieces)
    for _, theirs in pipes:
        back = receive(theirs)
        assert [cid for cid, _ in back] == [0, 1, 2]
        assert all(torch.equal(t, shared) for _, t in back)
        assert back[0][1] is back[2][1]  # one tensor again, as sent


def test_a_message_left_in_shared_memory_reads_back_and_owns_its_bytes():
    import mmap

    from fedexp.engine.executors.wire import put_in_space, take_from_space

    space = mmap.mmap(-1, 64 * 1024)
    message = ("end", [torch.arange(1000.0), torch.ones(3, dtype=torch.int64)], {"k": None})
    size = put_in_space(space, message)
    assert size is not None and 4000 < size < 5000  # the frame's body, nothing more
    back = take_from_space(space, size)
    space[: len(space)] = bytes(len(space))  # the next round writes over it
    assert back[0] == "end" and back[2] == {"k": None}
    assert torch.equal(back[1][0], torch.arange(1000.0)) and back[1][1].tolist() == [1, 1, 1]
    assert put_in_space(space, torch.zeros(20_000)) is None  # 80 kB does not fit: not written
    assert space[:8] == bytes(8)
    space.close()
