"""Where the image loaders find their files: CIFAR's published tar.gz read in place, torchvision
roots and the folders themselves as `dataset.data_dir`, and what the missing-files message names."""

from __future__ import annotations

import io
import pickle
import tarfile
from pathlib import Path

import numpy as np
import pytest

from components import with_yaml
from conftest import main_in_process
from datafiles import write_cifar10, write_cifar100, write_mnist
from fedexp.core.types import ConfigError
from fedexp.data.datasets import CIFAR10, load_cifar10, load_cifar100, load_fmnist, load_mnist

load_mnist = with_yaml(load_mnist, "dataset", "mnist")
load_fmnist = with_yaml(load_fmnist, "dataset", "fmnist")
load_cifar10 = with_yaml(load_cifar10, "dataset", "cifar10")
load_cifar100 = with_yaml(load_cifar100, "dataset", "cifar100")

CIFAR10_MEMBERS = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]


def batch(first_pixel: int, labels: list[int], label_key: bytes = b"labels") -> dict:
    """A batch as the published pickles hold it (bytes keys): image i is all `first_pixel + i`,
    except its blue plane, which is 200."""
    n = len(labels)
    data = np.repeat(np.arange(first_pixel, first_pixel + n, dtype=np.uint8)[:, None], 3072, 1)
    data[:, 2048:] = 200  # rows are R (1024), G (1024), B (1024)
    return {b"batch_label": b"b", b"data": data, label_key: labels, b"filenames": [b"x.png"] * n}


def add(tar: tarfile.TarFile, name: str, payload: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(payload)
    tar.addfile(info, io.BytesIO(payload))


def write_cifar10_archive(root: Path, extra: dict[str, bytes] | None = None) -> Path:
    """A real cifar-10-python.tar.gz: batch k holds 2 images (pixels 10k and 10k + 1, see
    `batch`) labelled k and 9 - k."""
    root.mkdir(parents=True, exist_ok=True)
    path = root / "cifar-10-python.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        add(tar, "cifar-10-batches-py/batches.meta", pickle.dumps({b"label_names": [b"a"] * 10}))
        for k, name in enumerate(CIFAR10_MEMBERS):
            add(tar, f"cifar-10-batches-py/{name}", pickle.dumps(batch(10 * k, [k, 9 - k]), 2))
        add(tar, "cifar-10-batches-py/readme.html", b"<html></html>")
        for name, payload in (extra or {}).items():
            add(tar, name, payload)
    return path


def test_cifar10_archive_read_in_place_by_hand(tmp_path):
    write_cifar10_archive(tmp_path)
    before = sorted(p.name for p in tmp_path.rglob("*"))
    ds = load_cifar10(str(tmp_path))
    assert ds.train_y.tolist() == [0, 9, 1, 8, 2, 7, 3, 6, 4, 5]
    assert ds.test_y.tolist() == [5, 4]
    mean, std = CIFAR10.mean, CIFAR10.std
    # training image 3 is batch 2's second image: red and green pixels 11, blue 200
    for channel, value in ((0, 11), (1, 11), (2, 200)):
        want = (value / 255 - mean[channel]) / std[channel]
        assert ds.train_x[3, channel].flatten().tolist() == pytest.approx([want] * 1024, abs=1e-6)
    assert ds.test_x[1, 0, 31, 31].item() == pytest.approx((51 / 255 - mean[0]) / std[0], abs=1e-6)
    assert sorted(p.name for p in tmp_path.rglob("*")) == before  # nothing extracted


def test_data_dir_may_name_the_archive_itself(tmp_path):
    archive = write_cifar10_archive(tmp_path)
    assert load_cifar10(str(archive)).train_y.tolist()[:2] == [0, 9]


def test_cifar100_archive_with_fine_labels(tmp_path):
    path = tmp_path / "cifar-100-python.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for name, first, labels in (("train", 0, [99, 0, 42]), ("test", 100, [7])):
            entry = batch(first, labels, b"fine_labels") | {b"coarse_labels": [1] * len(labels)}
            add(tar, f"./cifar-100-python/{name}", pickle.dumps(entry))
    ds = load_cifar100(str(tmp_path))
    assert ds.train_y.tolist() == [99, 0, 42] and ds.test_y.tolist() == [7]
    assert ds.train_x[2, 0, 0, 0].item() == pytest.approx((2 / 255 - 0.5071) / 0.2673, abs=1e-6)


def test_complete_folder_preferred_over_the_archive(tmp_path):
    write_cifar10(tmp_path, n_per_batch=3)
    (tmp_path / "cifar-10-python.tar.gz").write_bytes(b"not an archive")
    assert len(load_cifar10(str(tmp_path)).train_y) == 15


@pytest.mark.parametrize("bad_name", ["../evil", "/tmp/evil", "cifar-10-batches-py/../../x"])
def test_archive_with_an_escaping_member_is_refused(tmp_path, bad_name):
    archive = write_cifar10_archive(tmp_path, {bad_name: b"x"})
    with pytest.raises(ConfigError, match=r"refused: member .* absolute path or '\.\.'") as err:
        load_cifar10(str(tmp_path))
    assert str(err.value).startswith(f"dataset.data_dir: {archive}: ")


def test_archive_without_a_batch_names_the_member(tmp_path):
    path = tmp_path / "cifar-10-python.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        add(tar, "cifar-10-batches-py/data_batch_1", pickle.dumps(batch(0, [1])))
    with pytest.raises(ConfigError, match="no member cifar-10-batches-py/data_batch_2, "):
        load_cifar10(str(tmp_path))


def test_a_pickle_in_the_archive_goes_through_the_safe_unpickler(tmp_path):
    import os

    class Payload:
        def __reduce__(self):
            return os.system, (f"touch {tmp_path / 'ran'}",)

    write_cifar10_archive(tmp_path / "a")
    # rewrite with a malicious test batch
    path = tmp_path / "cifar-10-python.tar.gz"
    with (
        tarfile.open(tmp_path / "a" / "cifar-10-python.tar.gz") as src,
        tarfile.open(path, "w:gz") as tar,
    ):
        for member in src:
            payload = src.extractfile(member).read()
            if member.name.endswith("test_batch"):
                payload = pickle.dumps({b"data": Payload()})
            add(tar, member.name, payload)
    with pytest.raises(ConfigError, match=r"test_batch: refuses to unpickle (posix|nt)\.system"):
        load_cifar10(str(tmp_path))
    assert not (tmp_path / "ran").exists()


@pytest.mark.experiment
@pytest.mark.parametrize("cut", [0.7, 0.3, 0.03, 3 / 10**9])  # 3e-9: the gzip trailer only
def test_truncated_archive_exits_2_with_one_line(tmp_path, monkeypatch, capsys, cut):
    data = tmp_path / "data"
    archive = write_cifar10_archive(data)
    full = archive.read_bytes()
    archive.write_bytes(full[: len(full) - max(3, int(len(full) * cut))])
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FEDEXP_CACHE_DIR", str(tmp_path / "cache"))
    code, err = main_in_process(
        monkeypatch, capsys, "debug=smoke", "dataset=cifar10", f"dataset.data_dir={data}"
    )
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1, err
    assert lines[0].startswith(f"fedexp: error: dataset.data_dir: {archive}: ")
    assert "not a complete tar archive (EOFError: Compressed file ended" in lines[0]
    assert not list((tmp_path / "outputs").rglob(".hydra"))  # no run dir left behind
    assert sorted(p.name for p in data.iterdir()) == ["cifar-10-python.tar.gz"]


def test_torchvision_folders_themselves_as_data_dir(tmp_path):
    write_cifar10(tmp_path / "c", n_per_batch=2)
    assert len(load_cifar10(str(tmp_path / "c" / "cifar-10-batches-py")).train_y) == 10
    write_mnist(tmp_path / "m", "MNIST", n_train=12, n_test=4)
    for sub in ("", "MNIST", "MNIST/raw"):
        ds = load_mnist(str(tmp_path / "m" / sub))
        assert len(ds.train_y) == 12 and ds.train_y[:3].tolist() == [0, 1, 2]
    write_mnist(tmp_path / "f", "FashionMNIST", n_train=8, n_test=4, gz=True)
    assert len(load_fmnist(str(tmp_path / "f" / "FashionMNIST" / "raw")).train_y) == 8


def test_gz_files_directly_in_data_dir(tmp_path):
    write_mnist(tmp_path, "FashionMNIST", n_train=6, n_test=2, gz=True)
    flat = tmp_path / "fmnist"
    (tmp_path / "FashionMNIST" / "raw").rename(flat)
    assert sorted(p.name for p in flat.iterdir())[0] == "t10k-images-idx3-ubyte.gz"
    assert load_fmnist(str(flat)).train_y.tolist() == [0, 1, 2, 3, 4, 5]


def test_fmnist_never_reads_the_mnist_folder(tmp_path):
    write_mnist(tmp_path, "MNIST")
    for data_dir in (tmp_path / "MNIST", tmp_path / "MNIST" / "raw"):
        with pytest.raises(ConfigError, match="Fashion-MNIST not found"):
            load_fmnist(str(data_dir))
    with pytest.raises(
        ConfigError, match=r"found MNIST/raw here, which is MNIST \(dataset=mnist\)"
    ):
        load_fmnist(str(tmp_path))


def test_missing_message_points_one_level_down_and_up(tmp_path):
    write_cifar10(tmp_path / "cifar10" / "inner", n_per_batch=1)
    with pytest.raises(ConfigError) as err:
        load_cifar10(str(tmp_path / "cifar10"))
    message = str(err.value)
    assert message.startswith(
        f"dataset.data_dir: CIFAR-10 not found at {tmp_path / 'cifar10' / 'cifar-10-batches-py'} "
        "(missing data_batch_1, data_batch_2, data_batch_3, data_batch_4, data_batch_5, "
        "test_batch; no cifar-10-python.tar.gz either); found cifar-10-batches-py one level "
        f"down: set dataset.data_dir={tmp_path / 'cifar10' / 'inner'}; "
    )
    assert "\n" not in message
    with pytest.raises(
        ConfigError, match=f"one level up: set dataset.data_dir={tmp_path}/cifar10/inner;"
    ):
        load_cifar10(str(tmp_path / "cifar10" / "inner" / "elsewhere"))


def test_missing_message_names_an_archive_nearby_and_a_partial_folder(tmp_path):
    write_cifar10_archive(tmp_path / "dl")
    with pytest.raises(
        ConfigError,
        match=f"found cifar-10-python.tar.gz one level down: set dataset.data_dir={tmp_path}/dl;",
    ):
        load_cifar10(str(tmp_path))
    up = f"found cifar-10-python.tar.gz one level up: set dataset.data_dir={tmp_path}/dl;"
    with pytest.raises(ConfigError, match=up):
        load_cifar10(str(tmp_path / "dl" / "sub"))
    write_cifar10(tmp_path / "part", n_per_batch=1)
    (tmp_path / "part" / "cifar-10-batches-py" / "data_batch_4").unlink()
    with pytest.raises(ConfigError, match=r"cifar-10-batches-py \(missing data_batch_4; no cifar"):
        load_cifar10(str(tmp_path / "part"))


def test_missing_message_names_the_other_cifar(tmp_path):
    write_cifar100(tmp_path)
    with pytest.raises(
        ConfigError, match=r"found cifar-100-python here, which is CIFAR-100 \(dataset=cifar100\)"
    ):
        load_cifar10(str(tmp_path))


def test_corrupt_archive_is_one_line_naming_it(tmp_path):
    archive = write_cifar10_archive(tmp_path)
    data = bytearray(archive.read_bytes())
    data[len(data) // 2] ^= 0xFF
    archive.write_bytes(bytes(data))
    with pytest.raises(ConfigError, match=r"cifar-10-python\.tar\.gz: not a complete tar archive"):
        load_cifar10(str(tmp_path))


def test_leaf_json_progress_one_line_per_file_then_a_summary(tmp_path, caplog, monkeypatch):
    import json
    import logging

    from datafiles import leaf_blob, sent140_blob
    from fedexp.data import leaf
    from fedexp.data.leaf import read_leaf_json

    files = []
    for k, users in enumerate(({"a": 2, "b": 1}, {"c": 3})):
        files.append(tmp_path / f"part_{k}.json")
        files[-1].write_text(json.dumps(leaf_blob(users, seed=k)))
    with caplog.at_level(logging.INFO, logger="fedexp.data.leaf"):
        chunks, y, users = read_leaf_json(files, leaf._pixels, 62)
    lines = [r.getMessage() for r in caplog.records if r.name == "fedexp.data.leaf"]
    sizes = [f"{p.stat().st_size / 1e6:.1f} MB" for p in files]
    assert lines[0] == f"reading LEAF JSON 1/2: {files[0]} ({sizes[0]})"
    assert lines[1] == f"reading LEAF JSON 2/2: {files[1]} ({sizes[1]})"
    assert lines[2].startswith("read 2 LEAF JSON files (")
    assert ": 3 users, 6 samples in " in lines[2]
    assert len(lines) == 3 and users == ["a", "a", "b", "c", "c", "c"]

    # one small file: quiet; the same file over the threshold: announced (Sent140 rows too)
    single = tmp_path / "one.json"
    single.write_text(json.dumps(sent140_blob({"u": 2})))
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="fedexp.data.leaf"):
        read_leaf_json([single])
        assert not caplog.records
        monkeypatch.setattr(leaf, "PROGRESS_BYTES", single.stat().st_size)
        read_leaf_json([single])
    assert [r.getMessage().split(":")[0] for r in caplog.records] == [
        "reading LEAF JSON 1/1",
        "read 1 LEAF JSON files (0.0 MB)",
    ]
