"""Population scale: flat index tables, the vectorised local split, the partition report at
100 000 clients."""

from __future__ import annotations

import sys
import tracemalloc

import numpy as np
import pytest
import torch

from fedexp.data.datasets import Dataset
from fedexp.data.federated import FederatedData
from fedexp.data.partition import Partition, class_counts, local_split
from fedexp.data.partition_report import MAX_ROWS, plot_rows, write_partition_stats
from fedexp.data.schemes import Natural
from fedexp.data.split import Split


def loop_local_split(parts, test_fraction, rng, val_fraction):
    """The per-client reference: one permutation per client, cut test | val | train, sorted."""
    train, val, test = [], [], []
    for p in parts:
        perm = rng.permutation(p)
        n_test = int(round(test_fraction * len(p)))
        if test_fraction > 0 and len(p) >= 2:
            n_test = max(1, n_test)
        n_val = int(round(val_fraction * len(p)))
        if val_fraction > 0 and len(p) >= 3:
            n_val = max(1, n_val)
        n_val = max(0, min(n_val, len(p) - n_test - 1))
        test.append(np.sort(perm[:n_test]))
        val.append(np.sort(perm[n_test : n_test + n_val]))
        train.append(np.sort(perm[n_test + n_val :]))
    return train, val, test


def test_a_split_is_one_flat_array_and_offsets():
    split = Split.of([np.array([4, 7]), np.array([], dtype=np.int64), np.array([1, 2, 9])])
    assert split.flat.tolist() == [4, 7, 1, 2, 9] and split.offsets.tolist() == [0, 2, 2, 5]
    assert split.sizes.tolist() == [2, 0, 3] and split.owners().tolist() == [0, 0, 2, 2, 2]
    assert split[2].tolist() == [1, 2, 9] and split[-1].tolist() == [1, 2, 9] and len(split) == 3
    assert np.shares_memory(split[0], split.flat)  # a view, not a copy
    with pytest.raises(IndexError):
        split[3]
    part = Partition([np.array([0, 1])], [np.array([2])])
    assert isinstance(part.train, Split) and part.num_clients == 1


@pytest.mark.parametrize("test_fraction,val_fraction", [(0.2, 0.1), (0.2, 0.0), (0.0, 0.0)])
def test_vectorised_local_split_equals_the_per_client_loop(test_fraction, val_fraction):
    rng = np.random.default_rng(3)
    sizes = [1, 2, 3, 7, 50, 0, 11]
    parts = [np.sort(rng.choice(1000, n, replace=False)) for n in sizes]
    got = local_split(parts, test_fraction, np.random.default_rng(9), val_fraction)
    want = loop_local_split(parts, test_fraction, np.random.default_rng(9), val_fraction)
    for g, w in zip(got, want):
        assert [a.tolist() for a in g] == [a.tolist() for a in w]


def test_class_counts_by_hand():
    labels = np.array([0, 1, 1, 2, 2, 2])
    part = Partition([np.array([0, 1]), np.array([2, 3, 4, 5])], [np.array([]), np.array([])])
    assert class_counts(labels, part, 3).tolist() == [[1, 1, 0], [0, 1, 3]]


def test_100k_clients_index_tables_and_report_stay_flat(tmp_path):
    """100 000 natural clients (3-12 samples each, one feature: the population of the
    synthetic benchmark at a test's size): two arrays per split, one index tensor per split on
    the device, a CSV of every client and a plot of `MAX_ROWS` rows, in memory proportional to
    the samples."""
    n = 100_000
    rng = np.random.default_rng(0)
    owners = np.repeat(np.arange(n), rng.integers(3, 13, n))
    labels = rng.integers(0, 10, len(owners))
    x = torch.zeros(len(owners), 1)
    ds = Dataset("synthetic", x, torch.as_tensor(labels), None, None, 10, (1,), owners)
    samples = len(labels)
    scheme = Natural(
        2, n, server_pool=0, test_fraction=0.2, val_fraction=0.1, allow_missing_classes=False,
        reduce_fraction=0.0, reduce_factor=0.5,
    )  # fmt: skip
    blocks = sys.getallocatedblocks()
    tracemalloc.start()
    part = scheme(labels, n, 0, client_ids=owners, num_classes=10)
    data = FederatedData(ds, part, torch.device("cpu"))
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    # what stays alive is a few arrays, not an object per client (a list of per-client index
    # arrays would hold >= 3 * n Python objects)
    assert sys.getallocatedblocks() - blocks < n // 10
    assert peak < 160 * samples  # the partition's working arrays: 20 int64 per sample at most
    write_partition_stats(data, tmp_path)
    for split in (part.train, part.test, part.val):
        assert isinstance(split, Split) and len(split) == n
    assert part.train.sizes.sum() + part.test.sizes.sum() + part.val.sizes.sum() == samples
    flat, offsets = data.local_index("test")
    assert flat.numel() == offsets[-1] == part.test.sizes.sum()
    assert data.num_train(n - 1) == len(part.train[n - 1]) and data.train(7)[0].shape[1] == 1
    # the partition and the report hold a few int64 arrays per sample, not objects per client
    assert peak < 12 * 8 * samples
    rows = (tmp_path / "partition_stats.csv").read_text().splitlines()
    assert len(rows) == n + 1 and rows[1].startswith("0,,")
    assert (tmp_path / "partition_labels.png").stat().st_size > 1000
    counts = class_counts(ds.train_y.numpy(), part, 10)
    shown = plot_rows(counts)
    assert len(shown) == MAX_ROWS and len(np.unique(shown)) == MAX_ROWS
    # rows follow the dominant class: every class that dominates >= 1 % of clients is shown
    dominant = counts.argmax(1)
    common = np.flatnonzero(np.bincount(dominant, minlength=10) >= n // 100)
    assert set(common) <= set(dominant[shown].tolist())
