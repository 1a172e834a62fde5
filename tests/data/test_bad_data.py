"""Loading data never runs code, and data that does not add up is refused before training.

Every broken file here is written in its real on-disk format (IDX, CIFAR pickle, LEAF JSON) and
must give one `ConfigError` line `dataset.data_dir: <file>: <problem>`; through the CLI that is
exit 2, one stderr line and no run dir. Add a row to BAD_FILES for every new check.
"""

from __future__ import annotations

import gzip
import json
import pickle
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from components import with_yaml
from conftest import main_in_process
from datafiles import (
    MARKER,
    cifar10_batch,
    exec_payload,
    idx_bytes,
    leaf_blob,
    sent140_blob,
    system_payload,
    write_cifar10,
    write_cifar100,
    write_mnist,
)
from fedexp.core.client_store import ClientStore
from fedexp.core.types import ConfigError
from fedexp.data.datasets import (
    load_cifar10,
    load_cifar100,
    load_mnist,
)
from fedexp.data.leaf import load_femnist
from fedexp.data.text import load_sent140

load_cifar10 = with_yaml(load_cifar10, "dataset", "cifar10")


# ---- 1. loading never runs code ------------------------------------------------------------------
@pytest.mark.parametrize("payload", [system_payload, exec_payload])
def test_a_cifar_pickle_that_runs_code_is_refused_and_never_runs(tmp_path, payload):
    write_cifar10(tmp_path)
    entry = cifar10_batch(6)
    entry["data"] = payload(tmp_path)  # hidden inside an otherwise real batch
    batch = tmp_path / "cifar-10-batches-py" / "data_batch_1"
    batch.write_bytes(pickle.dumps(entry))
    with pytest.raises(ConfigError, match=r"^dataset\.data_dir: .*refuses to unpickle") as err:
        LOADERS["cifar10"](str(tmp_path))
    assert str(err.value).startswith(f"dataset.data_dir: {batch}: ")
    assert "\n" not in str(err.value)
    assert not (tmp_path / MARKER).exists()


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


# ---- 2. data that does not add up is refused -----------------------------------------------------
RAW = Path("MNIST/raw")
TRAIN_IMAGES, TRAIN_LABELS = RAW / "train-images-idx3-ubyte", RAW / "train-labels-idx1-ubyte"
TEST_IMAGES, TEST_LABELS = RAW / "t10k-images-idx3-ubyte", RAW / "t10k-labels-idx1-ubyte"
CIFAR = Path("cifar-10-batches-py")
FEMNIST = FEMNIST_TRAIN, FEMNIST_TEST = (
    Path("train/all_data_0_niid_0_keep_0_train_9.json"),
    Path("test/all_data_0_niid_0_keep_0_test_9.json"),
)
SENT140 = SENT140_TRAIN, SENT140_TEST = (
    Path("train/all_data_niid_0_keep_3_train_8.json"),
    Path("test/all_data_niid_0_keep_3_test_8.json"),
)


def mnist(root: Path, n_train: int = 20, n_test: int = 10) -> None:
    write_mnist(root, "MNIST", n_train=n_train, n_test=n_test)


def cifar(root: Path, damage: Callable[[dict], object], name: str = "data_batch_1") -> None:
    """CIFAR-10 whose batch `name` holds `damage(a good batch)` instead."""
    write_cifar10(root)
    (root / CIFAR / name).write_bytes(pickle.dumps(damage(cifar10_batch(10))))


def leaf(root: Path, files: tuple[Path, Path], blob, damage=None, test: bool = False) -> None:
    """LEAF train/ and test/ files holding `blob()`; the train (or test) one passed to `damage`."""
    for path in files:
        (root / path).parent.mkdir(parents=True)
        data = blob()
        if damage is not None and test == (path == files[1]):
            damage(data)
        (root / path).write_text(json.dumps(data))


def femnist(root: Path, damage: Callable[[dict], object] | None = None, test: bool = False):
    leaf(root, FEMNIST, lambda: leaf_blob({"f0001_41": 3, "f0002_42": 4}), damage, test)


def sent140(root: Path, damage: Callable[[dict], object], test: bool = False) -> None:
    leaf(root, SENT140, lambda: sent140_blob({"user0": 4, "user1": 4}), damage, test)


def first_user(blob: dict) -> dict:
    return blob["user_data"][blob["users"][0]]


LOADERS = {  # the YAML's values; no parse cache (its YAML value is a run-time path)
    "mnist": with_yaml(load_mnist, "dataset", "mnist"),
    "cifar10": with_yaml(load_cifar10, "dataset", "cifar10"),
    "cifar100": with_yaml(load_cifar100, "dataset", "cifar100"),
    "femnist": with_yaml(load_femnist, "dataset", "femnist", cache_dir=None),
    "sent140": with_yaml(load_sent140, "dataset", "sent140"),
}
RNG = np.random.default_rng(0)

# one row per broken data dir: a function writing it under root, registered with the dataset,
# the file the message must name (relative to root) and a substring of the problem
BAD_FILES: list = []


def bad(row_id: str, dataset: str, file: Path | str, problem: str):
    def register(write_broken: Callable[[Path], None]):
        BAD_FILES.append(pytest.param(dataset, write_broken, Path(file), problem, id=row_id))
        return write_broken

    return register


# ---- MNIST IDX
@bad("idx-not-gzip", "mnist", f"{TRAIN_IMAGES}.gz", "not a complete gzip file (BadGzipFile")
def _(r):
    mnist(r)
    (r / TRAIN_IMAGES).unlink()
    (r / f"{TRAIN_IMAGES}.gz").write_bytes(b"\0" * 64)


@bad("idx-truncated-gzip", "mnist", f"{TRAIN_LABELS}.gz", "not a complete gzip file (EOFError")
def _(r):
    mnist(r)
    data = (r / TRAIN_LABELS).read_bytes()
    (r / TRAIN_LABELS).unlink()
    (r / f"{TRAIN_LABELS}.gz").write_bytes(gzip.compress(data)[:20])


@bad(
    "idx-header-claims-more",
    "mnist",
    TRAIN_IMAGES,
    "the header says 20x28x28 (15680 bytes of images), the file holds 7840",
)
def _(r):
    mnist(r)
    (r / TRAIN_IMAGES).write_bytes(idx_bytes(RNG.integers(0, 256, (10, 28, 28)), (20, 28, 28)))


@bad("idx-truncated-header", "mnist", TEST_LABELS, "truncated IDX header (5 of 8 bytes)")
def _(r):
    mnist(r)
    (r / TEST_LABELS).write_bytes(b"\0\0\x08\x01\0")


@bad("idx-2d", "mnist", TRAIN_IMAGES, "IDX of 2 dimensions, expected 3 (images)")
def _(r):
    mnist(r)
    (r / TRAIN_IMAGES).write_bytes(idx_bytes(np.zeros((20, 784))))


@bad("idx-not-bytes", "mnist", TRAIN_LABELS, "not an unsigned-byte IDX file (magic 0x00000d01")
def _(r):
    mnist(r)
    (r / TRAIN_LABELS).write_bytes(b"\0\0\x0d\x01" + bytes(4 + 4 * 20))  # float32 labels


@bad("idx-test-image-size", "mnist", TEST_IMAGES, "images of 27x28, the training images are 28x28")
def _(r):
    mnist(r)
    (r / TEST_IMAGES).write_bytes(idx_bytes(np.zeros((10, 27, 28))))


@bad("idx-600-images-500-labels", "mnist", TRAIN_IMAGES, "600 images but train-labels-idx1-ubyte")
def _(r):
    mnist(r, n_train=600)
    (r / TRAIN_LABELS).write_bytes(idx_bytes(np.arange(500) % 10))


@bad("idx-label-200", "mnist", TRAIN_LABELS, "label 200 outside [0, 10) (sample 3, and 7 more)")
def _(r):
    mnist(r)
    (r / TRAIN_LABELS).write_bytes(idx_bytes(np.array([1, 2, 3, 200, 255] * 4)))


@bad("idx-test-label-77", "mnist", TEST_LABELS, "label 77 outside [0, 10) (sample 0)")
def _(r):
    mnist(r)
    (r / TEST_LABELS).write_bytes(idx_bytes(np.array([77] + [0] * 9)))


# ---- CIFAR pickles
@bad("cifar-runs-code", "cifar10", CIFAR / "data_batch_1", "refuses to unpickle posix.system")
def _(r):
    cifar(r, lambda e: {**e, "labels": system_payload(r)})


@bad("cifar-garbage", "cifar10", CIFAR / "data_batch_3", "not a readable pickle (")
def _(r):
    write_cifar10(r)
    # which error garbage raises depends on its bytes (UnpicklingError, UnicodeDecodeError...)
    (r / CIFAR / "data_batch_3").write_bytes(b"\x80\x04garbage" + RNG.bytes(300))


@bad("cifar-truncated", "cifar10", CIFAR / "test_batch", "not a readable pickle")
def _(r):
    write_cifar10(r)
    (r / CIFAR / "test_batch").write_bytes((r / CIFAR / "test_batch").read_bytes()[:1000])


@bad("cifar-not-a-dict", "cifar10", CIFAR / "data_batch_1", "not a CIFAR batch (a list, expected")
def _(r):
    cifar(r, lambda e: [e["data"], e["labels"]])


@bad("cifar-no-labels", "cifar10", CIFAR / "data_batch_1", "not a CIFAR batch (no 'labels'")
def _(r):
    cifar(r, lambda e: {"data": e["data"]})


@bad("cifar-5-fewer-labels", "cifar10", CIFAR / "data_batch_1", "10 images but 5 labels")
def _(r):
    cifar(r, lambda e: {**e, "labels": e["labels"][5:]})


@bad(
    "cifar-wrong-row-length",
    "cifar10",
    CIFAR / "data_batch_1",
    "'data' must be uint8 rows of 3072 pixels, got uint8 array of shape (10, 1024)",
)
def _(r):
    cifar(r, lambda e: {**e, "data": e["data"][:, :1024]})


@bad("cifar-float-pixels", "cifar10", CIFAR / "data_batch_1", "got float64 array of shape (10,")
def _(r):
    cifar(r, lambda e: {**e, "data": e["data"] / 255.0})


@bad("cifar-test-label-10", "cifar10", CIFAR / "test_batch", "label 10 outside [0, 10) (sample 0")
def _(r):
    cifar(r, lambda e: {**e, "labels": [10] * 10}, "test_batch")


@bad("cifar-string-labels", "cifar10", CIFAR / "data_batch_1", "must be a flat list of integers")
def _(r):
    cifar(r, lambda e: {**e, "labels": ["cat"] * 10})


@bad("cifar100-fine-label-100", "cifar100", "cifar-100-python/train", "label 100 outside [0, 100)")
def _(r):
    write_cifar100(r)
    entry = {"data": np.zeros((2, 3072), np.uint8), "fine_labels": [3, 100]}
    (r / "cifar-100-python" / "train").write_bytes(pickle.dumps(entry))


# ---- FEMNIST (LEAF JSON)
@bad("leaf-truncated", "femnist", FEMNIST_TRAIN, "not JSON (JSONDecodeError")
def _(r):
    femnist(r)
    (r / FEMNIST_TRAIN).write_bytes((r / FEMNIST_TRAIN).read_bytes()[:500])


@bad("leaf-not-json", "femnist", FEMNIST_TEST, "not JSON")
def _(r):
    femnist(r)
    (r / FEMNIST_TEST).write_bytes(b"\x89PNG\r\n")


@bad("leaf-not-leaf", "femnist", FEMNIST_TRAIN, "not LEAF JSON")
def _(r):
    femnist(r)
    (r / FEMNIST_TRAIN).write_text("[1, 2]")


@bad("leaf-rows-of-392", "femnist", FEMNIST_TRAIN, "user f0001_41: sample 0 has 392 values")
def _(r):
    femnist(r, lambda b: first_user(b).update(x=[row[:392] for row in first_user(b)["x"]]))


@bad("leaf-ragged", "femnist", FEMNIST_TRAIN, "user f0001_41: sample 2 has 783 values")
def _(r):
    femnist(r, lambda b: first_user(b)["x"][2].pop())


@bad("leaf-writer-twice", "femnist", FEMNIST_TRAIN, "user f0001_41: listed twice")
def _(r):
    femnist(r, lambda b: (b["users"].append("f0001_41"), b["num_samples"].append(3)))


@bad("leaf-null-pixel", "femnist", FEMNIST_TRAIN, "f0001_41: x holds a pixel that is not a number")
def _(r):
    femnist(r, lambda b: first_user(b)["x"][1].__setitem__(5, None))


@bad("leaf-nan-pixel", "femnist", FEMNIST_TRAIN, "f0001_41: sample 1: pixel value nan is not")
def _(r):
    femnist(r, lambda b: first_user(b)["x"][1].__setitem__(5, float("nan")))


@bad("leaf-test-label-77", "femnist", FEMNIST_TEST, "f0001_41: label 77 outside [0, 62) (sample 0)")
def _(r):
    femnist(r, lambda b: first_user(b)["y"].__setitem__(0, 77), test=True)


@bad("leaf-x-longer-than-y", "femnist", FEMNIST_TRAIN, "f0001_41: 3 samples in x but 2 labels")
def _(r):
    femnist(r, lambda b: first_user(b)["y"].pop())


@bad("leaf-num-samples", "femnist", FEMNIST_TRAIN, "f0001_41: num_samples says 9, x and y hold 3")
def _(r):
    femnist(r, lambda b: b.update(num_samples=[9, 4]))


# ---- Sent140 (LEAF JSON): the labels must be Sent140's two classes
@bad("sent140-test-label-2", "sent140", SENT140_TEST, "user0: label 2 outside [0, 2) (sample 1)")
def _(r):
    sent140(r, lambda b: first_user(b)["y"].__setitem__(1, 2), test=True)


@bad("sent140-label-minus-1", "sent140", SENT140_TRAIN, "user0: label -1 outside [0, 2) (sample 3)")
def _(r):
    sent140(r, lambda b: first_user(b)["y"].__setitem__(3, -1))


@bad("sent140-short-row", "sent140", SENT140_TRAIN, "user0: sample 2 is not an [id, date, query")
def _(r):
    sent140(r, lambda b: first_user(b)["x"][2].pop())


# ---- files that are no files, and pixels outside LEAF's [0, 1]
@bad("leaf-json-is-a-dir", "femnist", "train/more.json", "a directory, expected a data file")
def _(r):
    femnist(r)
    (r / "train" / "more.json").mkdir()


@bad("leaf-json-link-loop", "sent140", "train/loop.json", "cannot be read (OSError: [Errno 40]")
def _(r):
    sent140(r, lambda b: None)
    (r / "train" / "loop.json").symlink_to(r / "train" / "loop.json")


@bad("leaf-pixels-0-255", "femnist", FEMNIST_TRAIN, "f0001_41: sample 0: pixel value 255.0 outside")
def _(r):
    femnist(r, lambda b: first_user(b)["x"][0].__setitem__(7, 255.0))


SENT140_CSV = "training.1600000.processed.noemoticon.csv"
CSV_ROW = '"0","1","Mon Apr 06 2009","NO_QUERY","u1","so sad"\n'


@bad("sent140-csv-is-a-dir", "sent140", SENT140_CSV, "a directory, expected a data file")
def _(r):
    (r / SENT140_CSV).mkdir()


@bad("sent140-csv-open-quote", "sent140", f"{SENT140_CSV}:2", "a quote opened on this line is not")
def _(r):
    (r / SENT140_CSV).write_text(CSV_ROW + CSV_ROW.replace('"so sad"', '"so sad') + CSV_ROW * 2)


@bad("sent140-csv-open-quote-at-end", "sent140", f"{SENT140_CSV}:3", "a quote opened on this")
def _(r):
    (r / SENT140_CSV).write_text(CSV_ROW * 2 + CSV_ROW.replace('"so sad"', '"so sad'))


@pytest.mark.parametrize(("dataset", "write_broken", "file", "problem"), BAD_FILES)
def test_bad_file_is_one_line_naming_the_file(tmp_path, dataset, write_broken, file, problem):
    root = tmp_path / dataset
    root.mkdir()
    write_broken(root)
    with pytest.raises(ConfigError) as err:
        LOADERS[dataset](str(root))
    message = str(err.value)
    assert message.startswith(f"dataset.data_dir: {root / file}: "), message
    assert problem in message and "\n" not in message, message
    assert not (root / MARKER).exists()


# through the real CLI (in this process): exit 2, one stderr line, no run dir, no payload run
CLI_ROWS = ["cifar-runs-code", "idx-600-images-500-labels", "leaf-writer-twice"]


@pytest.mark.experiment
@pytest.mark.parametrize("row", CLI_ROWS)
def test_bad_file_through_the_cli_exits_2_with_one_line(tmp_path, monkeypatch, capsys, row):
    dataset, write_broken, file, problem = next(p.values for p in BAD_FILES if p.id == row)
    root = tmp_path / "data" / dataset
    root.mkdir(parents=True)
    write_broken(root)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FEDEXP_CACHE_DIR", str(tmp_path / "cache"))
    code, err = main_in_process(
        monkeypatch, capsys, "debug=smoke", f"dataset={dataset}", f"dataset.data_dir={root}"
    )
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1, err
    assert lines[0].startswith(f"fedexp: error: dataset.data_dir: {root / file}: ")
    assert problem in lines[0]
    assert not list((tmp_path / "outputs").rglob(".hydra"))  # no run dir left behind
    assert not (root / MARKER).exists()
