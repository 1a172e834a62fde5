"""Loading data never runs code, and data that does not add up is refused before training.

Every broken file here is written in its real on-disk format (IDX, CIFAR pickle, LEAF JSON) and
must give one `ConfigError` line `dataset.data_dir: <file>: <problem>`; through the CLI that is
exit 2, one stderr line and no run dir. Add a row to BAD_FILES for every new check.
"""

from __future__ import annotations

import builtins
import os
import pickle
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from datafiles import cifar10_batch, write_cifar10
from fedexp.core.client_store import ClientStore
from fedexp.core.types import ConfigError
from fedexp.data.datasets import CIFAR10_MEAN, CIFAR10_STD, load_cifar10

MARKER = "payload_ran"  # the file a malicious pickle would create in the data dir


class Payload:
    """Unpickles as the call `func(*args)`: what a malicious `__reduce__` looks like."""

    def __init__(self, func: Callable, args: tuple):
        self.func, self.args = func, args

    def __reduce__(self):
        return self.func, self.args


def system_payload(root: Path) -> Payload:
    return Payload(os.system, (f"touch {root / MARKER}",))


def exec_payload(root: Path) -> Payload:
    return Payload(builtins.exec, (f"open({str(root / MARKER)!r}, 'w').close()",))


# ---- 1. loading never runs code ------------------------------------------------------------------
@pytest.mark.parametrize("payload", [system_payload, exec_payload])
def test_a_cifar_pickle_that_runs_code_is_refused_and_never_runs(tmp_path, payload):
    write_cifar10(tmp_path)
    entry = cifar10_batch(6)
    entry["data"] = payload(tmp_path)  # hidden inside an otherwise real batch
    batch = tmp_path / "cifar-10-batches-py" / "data_batch_1"
    batch.write_bytes(pickle.dumps(entry))
    with pytest.raises(ConfigError, match=r"^dataset\.data_dir: .*refuses to unpickle") as err:
        load_cifar10(str(tmp_path))
    assert str(err.value).startswith(f"dataset.data_dir: {batch}: ")
    assert "\n" not in str(err.value)
    assert not (tmp_path / MARKER).exists()


@pytest.mark.parametrize(("protocol", "byte_keys"), [(2, True), (2, False), (5, True), (5, False)])
def test_cifar_batches_load_with_str_or_bytes_keys_and_any_protocol(tmp_path, protocol, byte_keys):
    write_cifar10(tmp_path, n_per_batch=4, protocol=protocol, byte_keys=byte_keys)
    ds = load_cifar10(str(tmp_path))
    first, test = cifar10_batch(4, seed=0), cifar10_batch(4, seed=5)
    assert ds.train_y.tolist() == first["labels"] * 5 and ds.test_y.tolist() == test["labels"]
    # pixel 0 of image 0's red plane, and pixel 0 of its blue plane (row offset 2048), by hand
    red, blue = first["data"][0, 0], first["data"][0, 2048]
    assert ds.train_x[0, 0, 0, 0].item() == pytest.approx(
        (red / 255 - CIFAR10_MEAN[0]) / CIFAR10_STD[0]
    )
    assert ds.train_x[0, 2, 0, 0].item() == pytest.approx(
        (blue / 255 - CIFAR10_MEAN[2]) / CIFAR10_STD[2]
    )


def test_client_store_spills_round_trip(tmp_path):
    store = ClientStore(max_bytes=100, spill_dir=tmp_path)  # one 80-byte state fits, two do not
    head = {"head": torch.arange(20.0), "steps": [1, 2], "name": "fc"}
    store.put(0, head)
    store.put(1, torch.ones(20))
    assert store.num_spilled == 1 and (tmp_path / "client_0.pt").exists()
    assert store.state_dict()[0]["steps"] == [1, 2]  # read back without re-admitting
    back = store.get(0)
    assert torch.equal(back["head"], torch.arange(20.0)) and back["name"] == "fc"
    assert store.num_spilled == 1 and torch.equal(store.get(1), torch.ones(20))


def test_a_tampered_spill_file_is_refused_and_never_runs(tmp_path):
    store = ClientStore(max_bytes=100, spill_dir=tmp_path / "spill")
    store.put(0, torch.zeros(20))
    store.put(1, torch.zeros(20))
    torch.save(system_payload(tmp_path), tmp_path / "spill" / "client_0.pt")
    with pytest.raises(pickle.UnpicklingError):
        store.get(0)
    assert not (tmp_path / MARKER).exists()
