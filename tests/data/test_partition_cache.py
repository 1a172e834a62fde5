"""The partition cache: keyed by the labels, corrupt files (or a directory in a file's place)
recomputed, a cache that cannot be written skipped, concurrent writes safe."""

from __future__ import annotations

import errno
import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import fedexp.data.partition as partition_module
from components import partition_dataset
from fedexp.data import cache_files
from fedexp.data.partition import Partition
from fedexp.data.partition_cache import load as _load
from fedexp.data.partition_cache import save as _save

LABELS = np.repeat(np.arange(10), 50)  # 10 classes x 50 samples, sorted


def split(labels, cache_dir, scheme="shards", params=None, client_ids=None, num_clients=10):
    return partition_dataset(
        labels,
        num_clients,
        scheme,
        seed=1,
        params={"classes_per_client": 2} if params is None else params,
        client_ids=client_ids,
        cache_dir=cache_dir,
    )


def same(a: Partition, b: Partition) -> bool:
    return all(np.array_equal(x, y) for x, y in zip(a.train + a.test, b.train + b.test))


def cached_files(tmp_path):
    return sorted((tmp_path / "partitions").iterdir())


def test_changed_labels_of_the_same_count_are_a_new_partition(tmp_path):
    split(LABELS, tmp_path)
    shuffled = np.random.default_rng(0).permutation(LABELS)  # same count, same class sizes
    again = split(shuffled, tmp_path)
    assert same(again, split(shuffled, None))  # not the partition of the old labels
    for tr, te in zip(again.train, again.test):
        assert len(np.unique(shuffled[np.concatenate([tr, te])])) == 2
    assert len(cached_files(tmp_path)) == 2


def test_changed_client_ids_are_a_new_partition(tmp_path):
    owners = np.repeat(np.arange(5), 100)
    params = {"min_samples": 2}
    first = split(LABELS, tmp_path, "natural", params, client_ids=owners, num_clients=5)
    moved = np.roll(owners, 50)
    second = split(LABELS, tmp_path, "natural", params, client_ids=moved, num_clients=5)
    assert not same(first, second)
    assert same(second, split(LABELS, None, "natural", params, client_ids=moved, num_clients=5))


def test_a_new_scheme_version_does_not_reuse_old_files(tmp_path, monkeypatch):
    monkeypatch.setattr(partition_module, "PARTITION_VERSION", 1)
    split(LABELS, tmp_path)
    monkeypatch.setattr(partition_module, "PARTITION_VERSION", 2)
    split(LABELS, tmp_path)
    assert len(cached_files(tmp_path)) == 2


def truncate(path):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def wrong_clients(path):
    _save(path, Partition([np.arange(3)], [np.arange(3, 5)]))


def out_of_range(path):
    _save(path, Partition([np.array([10_000])] * 10, [np.array([0])] * 10))


@pytest.mark.parametrize(
    "corrupt",
    [
        truncate,
        lambda p: p.write_bytes(b""),
        lambda p: p.write_bytes(b"not a zip file"),
        wrong_clients,
        out_of_range,
    ],
    ids=["truncated", "empty", "garbage", "wrong_clients", "out_of_range"],
)
def test_a_corrupt_cache_file_is_recomputed_and_rewritten(tmp_path, corrupt):
    fresh = split(LABELS, None)
    split(LABELS, tmp_path)
    (path,) = cached_files(tmp_path)
    corrupt(path)
    assert same(split(LABELS, tmp_path), fresh)
    reloaded = _load(path, 10, len(LABELS))  # the file was rewritten whole
    assert reloaded is not None and same(reloaded, fresh)


def test_a_directory_in_place_of_a_cache_file_is_recomputed_and_replaced(tmp_path, caplog):
    fresh = split(LABELS, None)
    split(LABELS, tmp_path)
    (path,) = cached_files(tmp_path)
    path.unlink()
    path.mkdir()
    (path / "left-over").write_text("x")
    with caplog.at_level(logging.WARNING, logger="fedexp.data.partition_cache"):
        assert same(split(LABELS, tmp_path), fresh)
    assert [r.getMessage() for r in caplog.records] == [
        f"partition cache {path}: not a file; recomputing it"
    ]
    assert cached_files(tmp_path) == [path] and path.is_file()  # no temporary file left
    reloaded = _load(path, 10, len(LABELS))
    assert reloaded is not None and same(reloaded, fresh)


def test_a_cache_that_cannot_be_written_is_logged_and_the_partition_returned(
    tmp_path, monkeypatch, caplog
):
    def full_disk(f, **arrays):
        f.write(b"PK")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    fresh = split(LABELS, None)
    monkeypatch.setattr(cache_files.np, "savez", full_disk)
    with caplog.at_level(logging.WARNING, logger="fedexp.data.partition_cache"):
        assert same(split(LABELS, tmp_path), fresh)
    (message,) = [r.getMessage() for r in caplog.records]
    assert message.startswith(f"partition cache {tmp_path / 'partitions'}/")
    assert message.endswith(".npz cannot be written (No space left on device); not cached")
    assert cached_files(tmp_path) == []  # no temporary file left


def test_a_cache_file_replaced_by_a_directory_does_not_stop_a_run(cli_in_process):
    cli_in_process("debug=smoke", "hydra.run.dir=first")
    (path,) = sorted((cli_in_process.cwd / "cache" / "partitions").iterdir())
    path.unlink()
    path.mkdir()
    proc = cli_in_process("debug=smoke", "hydra.run.dir=second", check=False)
    assert proc.returncode == 0, proc.stderr
    assert "tmp" not in proc.stderr and path.is_file()
    assert (cli_in_process.cwd / "second" / "summary.json").is_file()


def test_concurrent_writers_of_one_key_leave_one_valid_file(tmp_path, caplog):
    path = tmp_path / "partitions" / "key.npz"
    partition = split(LABELS, None)
    start = threading.Barrier(10)

    def write(i):
        if i < 10:  # the first ten writes start together
            start.wait()
        _save(path, partition)

    logged = caplog.at_level(logging.WARNING, logger="fedexp.data.partition_cache")
    with logged, ThreadPoolExecutor(max_workers=10) as pool:
        list(pool.map(write, range(50)))
    assert not caplog.records  # no write failed (a failed one is logged, not raised)
    assert cached_files(tmp_path) == [path]  # no temporary file left behind
    loaded = _load(path, 10, len(LABELS))
    assert loaded is not None and same(loaded, partition)


def test_concurrent_runs_of_one_key_agree(tmp_path):
    fresh = split(LABELS, None)
    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(lambda _: split(LABELS, tmp_path), range(24)))
    assert all(same(r, fresh) for r in results)
    assert len(cached_files(tmp_path)) == 1


def test_the_server_pool_is_part_of_the_key(tmp_path):
    # the pool is set aside before partitioning: another size is another partition
    split(LABELS, tmp_path, params={"classes_per_client": 2, "server_pool": 0})
    split(LABELS, tmp_path, params={"classes_per_client": 2, "server_pool": 16})
    assert len(cached_files(tmp_path)) == 2
    split(LABELS, tmp_path, params={"classes_per_client": 2, "server_pool": 16})
    assert len(cached_files(tmp_path)) == 2  # the same key: a hit
