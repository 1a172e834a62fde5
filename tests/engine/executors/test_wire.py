"""The pool's pipe messages (`engine/executors/wire.py`): tensors as their bytes, and a sender
that does not wait for its reader."""

from __future__ import annotations

import multiprocessing
import pickle
import threading

import pytest
import torch

from fedexp.engine.executors.wire import Sender, dumps, receive


def test_tensors_travel_as_their_bytes_with_dtype_and_shape():
    message = {"w": torch.arange(6.0).reshape(2, 3), "h": torch.ones(2).half(), "n": 3}
    back = pickle.loads(dumps(message))
    assert torch.equal(back["w"], message["w"]) and back["h"].dtype == torch.float16
    assert back["n"] == 3
    back["w"][0, 0] = 7.0  # the tensor read back owns its bytes
    assert message["w"][0, 0] == 0.0


def test_a_sender_returns_before_its_reader_reads_and_keeps_the_order():
    mine, theirs = multiprocessing.Pipe()
    sender = Sender(mine)
    big = torch.arange(1_000_000, dtype=torch.float32)  # 4 MB: far more than a pipe holds
    done = threading.Event()

    def put_both():  # nobody reads yet: a plain send of `big` would block for good
        sender.put(("first", big))
        sender.put(("second", 2))
        done.set()

    threading.Thread(target=put_both, daemon=True).start()
    assert done.wait(timeout=30)
    first, second = receive(theirs), receive(theirs)
    assert first[0] == "first" and torch.equal(first[1], big) and second == ("second", 2)
    sender.flush()


def test_a_sender_whose_reader_is_gone_raises_at_the_next_put():
    mine, theirs = multiprocessing.Pipe()
    sender = Sender(mine)
    theirs.close()
    sender.put("lost")  # the thread finds the pipe broken
    with pytest.raises(OSError):
        sender.flush()
    with pytest.raises(OSError):
        sender.put("after")
