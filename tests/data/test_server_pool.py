"""partition.server_pool: training samples set aside before partitioning, held by no client, the
same for every algorithm."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import smoke_experiment
from fedexp.data.datasets import Dataset
from fedexp.data.server_pool import reserve_server_pool
from fedexp.errors import ConfigError


def tiny(n: int = 10) -> Dataset:
    x = torch.arange(n, dtype=torch.float32)[:, None]  # input i is the number i
    owners = np.arange(n) // 2
    return Dataset("tiny", x, torch.arange(n) % 3, None, None, 3, (1,), owners)


def test_the_pool_and_the_clients_samples_split_the_training_set():
    ds = reserve_server_pool(tiny(), 4, seed=0)
    pool, kept = ds.server_x[:, 0].long(), ds.train_x[:, 0].long()
    assert len(pool) == 4 and len(kept) == 6
    assert sorted(pool.tolist() + kept.tolist()) == list(range(10))  # disjoint, all covered
    assert ds.train_y.tolist() == (kept % 3).tolist()  # labels follow their inputs
    assert ds.train_client_ids.tolist() == (kept // 2).tolist()  # and so do the owners
    again = reserve_server_pool(tiny(), 4, seed=0)
    assert torch.equal(again.server_x, ds.server_x)  # a function of the seed
    assert not torch.equal(reserve_server_pool(tiny(), 4, seed=1).server_x, ds.server_x)


def test_no_pool_leaves_the_data_as_it_is_and_too_large_a_pool_is_refused():
    ds = reserve_server_pool(tiny(), 0, seed=0)
    assert ds.server_x is None and len(ds.train_y) == 10
    with pytest.raises(ConfigError, match="partition.server_pool: 10 >= the 10 training"):
        reserve_server_pool(tiny(), 10, seed=0)


@pytest.mark.experiment
@pytest.mark.parametrize("algorithm", ["fedprox", "fedrep", "fedhenn"])
def test_an_explicit_pool_gives_every_algorithm_the_same_clients_data_and_pool(tmp_path, algorithm):
    from fedexp.runtime.fingerprint import data_digest

    pool = "partition.server_pool=16"
    avg = smoke_experiment(tmp_path / "a", "algorithm=fedavg", pool).data
    other = smoke_experiment(tmp_path / "b", f"algorithm={algorithm}", pool).data
    assert len(avg.server_x) == 16
    assert torch.equal(avg.server_x, other.server_x) and torch.equal(avg.x, other.x)
    for split in ("train", "val", "test"):
        for cid in range(avg.num_clients):
            assert torch.equal(avg._slice(split, cid), other._slice(split, cid))
    assert data_digest(avg) == data_digest(other)  # summary.json's data_fingerprint
    # no pool input is one of the clients' training inputs (digits' rows are distinct here)
    pool, train = avg.server_x.flatten(1), avg.x[avg.train_pool()].flatten(1)
    assert not bool((pool[:, None, :] == train[None, :, :]).all(-1).any())


@pytest.mark.experiment
@pytest.mark.parametrize("algorithm", ["fedavg", "fedprox", "fedrep", "waffle", "frl"])
def test_by_default_a_run_that_reads_no_pool_withholds_nothing(tmp_path, algorithm):
    exp = smoke_experiment(tmp_path, f"algorithm={algorithm}")
    assert exp.cfg.partition.server_pool == 0 and exp.data.server_x is None
    assert len(exp.data.x) == 1438  # every digits training sample reaches the partition
    assert exp.data.coverage["data/server_pool"] == 0


@pytest.mark.experiment
def test_by_default_fedhenn_sets_aside_twice_its_rad_and_the_fingerprints_tell(tmp_path):
    from fedexp.runtime.fingerprint import data_digest

    henn = smoke_experiment(tmp_path / "h", "algorithm=fedhenn")  # smoke's rad_size: 8
    assert henn.cfg.partition.server_pool == 16 and len(henn.data.server_x) == 16
    assert len(henn.data.x) == 1438 - 16
    assert henn.data.coverage["data/server_pool"] == 16
    avg = smoke_experiment(tmp_path / "a", "algorithm=fedavg")
    assert data_digest(avg.data) != data_digest(henn.data)  # compared, they held other data
    no_rad = smoke_experiment(tmp_path / "t", "algorithm=fedhenn", "algorithm.rad_source=train")
    assert no_rad.data.server_x is None  # a RAD from the clients' inputs needs no pool


@pytest.mark.experiment
def test_the_share_the_clients_hold_counts_the_pool(tmp_path):
    # digits: 1438 training samples; shards keep every one; local splits 0.7 / 0.1 / 0.2
    full = smoke_experiment(tmp_path / "a", "algorithm=fedavg").data.coverage
    assert full["data/held_by_clients"] == 1.0
    pooled = smoke_experiment(
        tmp_path / "b", "partition.server_pool=200", "partition.max_server_pool=null"
    ).data.coverage
    assert pooled["data/held_by_clients"] == pytest.approx(1238 / 1438)
    assert pooled["data/train_fraction_used"] < 0.7 * 1238 / 1438 + 0.01
