"""Cache files carry a checksum of their content (`fedexp.data.cache_files`): a file of the right
shapes but other contents is recomputed with one log line, and many writers of one fresh file
at once (threads or processes) all succeed and leave one whole file."""

from __future__ import annotations

import logging
import multiprocessing
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch

from components import with_yaml
from datafiles import write_leaf_femnist
from fedexp.data import cache_files, leaf
from fedexp.data.partition import Partition
from fedexp.data.partition_cache import load as load_partition
from fedexp.data.partition_cache import save as save_partition

load_femnist = with_yaml(leaf.load_femnist, "dataset", "femnist")


def tamper(path, change) -> None:
    """Rewrite path's arrays changed by `change(arrays)`, keeping the stored checksum."""
    with np.load(path) as z:
        arrays = {k: z[k].copy() for k in z.files}
    change(arrays)
    np.savez(path, **arrays)


def warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


# ---- the partition cache
def _test_is_train(a):  # right shapes: every client's test indices are its first train ones
    for k in range(len(a["test_off"]) - 1):
        lo, hi = a["test_off"][k], a["test_off"][k + 1]
        a["test"][lo:hi] = a["train"][a["train_off"][k] : a["train_off"][k] + hi - lo]


def _one_client_holds_all(a):  # the train offsets give client 0 every training sample
    a["train_off"][1:] = a["train_off"][-1]


@pytest.mark.parametrize(
    ("edit", "reason"),
    [
        (_test_is_train, "checksum mismatch"),
        (_one_client_holds_all, "checksum mismatch"),
        (lambda a: a.pop(cache_files.CHECKSUM), "no checksum"),
    ],
    ids=["test-equals-train", "one-client-holds-all", "no-checksum"],
)
def test_an_edited_partition_file_is_recomputed_with_one_log_line(tmp_path, caplog, edit, reason):
    path = tmp_path / "p.npz"
    good = Partition([np.arange(0, 8), np.arange(10, 18)], [np.arange(8, 10), np.arange(18, 20)])
    save_partition(path, good)
    tamper(path, edit)
    with caplog.at_level(logging.WARNING):
        assert load_partition(path, 2, 20) is None  # a miss: the caller recomputes and rewrites
    (line,) = warnings(caplog)
    assert line.startswith(f"partition cache {path}: {reason}") and line.endswith("recomputing it")
    save_partition(path, good)
    again = load_partition(path, 2, 20)
    assert again is not None and all(np.array_equal(a, b) for a, b in zip(again.train, good.train))


def test_a_cache_file_copied_to_another_name_fails_its_checksum(tmp_path):
    cache_files.write(tmp_path / "a.npz", {"x": np.arange(3)})
    (tmp_path / "b.npz").write_bytes((tmp_path / "a.npz").read_bytes())
    assert cache_files.read(tmp_path / "a.npz")[0] is not None
    assert cache_files.read(tmp_path / "b.npz") == (
        None,
        "checksum mismatch (its contents changed after it was written)",
    )


# ---- the FEMNIST parse cache
def femnist_dir(tmp_path):
    write_leaf_femnist(tmp_path / "f", {"w1": 3, "w2": 2}, test_per_writer=1)
    return str(tmp_path / "f")


def _truncate(path):
    path.write_bytes(path.read_bytes()[:100])


@pytest.mark.parametrize(
    "damage",
    [
        _truncate,
        lambda p: tamper(p, lambda a: a.update(train_y=a["train_y"][::-1].copy())),
        lambda p: tamper(p, lambda a: a.update(test_x=a["train_x"][: len(a["test_x"])])),
    ],
    ids=["truncated", "labels-reversed", "test-equals-train"],
)
def test_a_damaged_femnist_parse_cache_is_parsed_again_with_one_log_line(tmp_path, caplog, damage):
    data_dir, cache = femnist_dir(tmp_path), str(tmp_path / "cache")
    fresh = load_femnist(data_dir, cache_dir=None)
    load_femnist(data_dir, cache_dir=cache)
    (path,) = (tmp_path / "cache" / "femnist").iterdir()
    damage(path)
    with caplog.at_level(logging.WARNING):
        again = load_femnist(data_dir, cache_dir=cache)
    (line,) = warnings(caplog)
    assert line.startswith(f"FEMNIST parse cache {path}: ") and "parsing the data again" in line
    for a, b in ((again.train_x, fresh.train_x), (again.train_y, fresh.train_y)):
        assert torch.equal(a, b)
    assert torch.equal(again.test_x, fresh.test_x)
    assert cache_files.read(path)[0] is not None  # rewritten whole


def test_ten_runs_on_a_fresh_femnist_cache_at_once_all_load_it(tmp_path):
    data_dir, cache = femnist_dir(tmp_path), str(tmp_path / "cache")
    fresh = load_femnist(data_dir, cache_dir=None)
    start = threading.Barrier(10)
    parse = leaf.read_leaf_json

    def parse_then_wait(*args, **kwargs):  # every run parses, then all write at once
        found = parse(*args, **kwargs)
        if "test" not in str(args[0][0]):
            start.wait()
        return found

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(leaf, "read_leaf_json", parse_then_wait)
        with ThreadPoolExecutor(max_workers=10) as pool:
            runs = list(pool.map(lambda _: load_femnist(data_dir, cache_dir=cache), range(10)))
    assert all(torch.equal(r.train_x, fresh.train_x) for r in runs)
    (path,) = (tmp_path / "cache" / "femnist").iterdir()  # no temporary file left behind
    assert cache_files.read(path)[0] is not None


def _write_many(path, barrier, value):
    barrier.wait()
    for _ in range(5):
        cache_files.write(path, {"x": np.full(10_000, value)})


def test_processes_writing_one_cache_file_at_once_all_succeed(tmp_path):
    context = multiprocessing.get_context("fork")
    barrier = context.Barrier(6)
    path = tmp_path / "c" / "shared.npz"
    workers = [context.Process(target=_write_many, args=(path, barrier, v)) for v in range(6)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=30)
    assert [w.exitcode for w in workers] == [0] * 6
    arrays, problem = cache_files.read(path)
    assert problem is None and len(set(arrays["x"].tolist())) == 1  # one writer's whole file
    assert sorted(p.name for p in path.parent.iterdir()) == ["shared.npz"]
