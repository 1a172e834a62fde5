"""partition=natural: one client per owner, with min_samples and max_clients."""

from __future__ import annotations

import numpy as np
import pytest

from components import with_yaml
from fedexp.core.types import ConfigError
from fedexp.data.partition import natural, natural_clients

natural = with_yaml(natural, "partition", "natural", max_clients=None, min_samples=0)

OWNERS = np.array(["b", "a", "b", "c", "a", "b", "d", "d"])  # a: 2, b: 3, c: 1, d: 2 samples


def split(num_clients, **params):
    return natural(np.zeros(len(OWNERS)), num_clients, np.random.default_rng(0), OWNERS, **params)


def test_one_client_per_owner_in_owner_order():
    parts = split(4)
    assert [p.tolist() for p in parts] == [[1, 4], [0, 2, 5], [3], [6, 7]]


def test_min_samples_drops_small_owners():
    assert [p.tolist() for p in split(3, min_samples=2)] == [[1, 4], [0, 2, 5], [6, 7]]


def test_max_clients_keeps_a_seeded_subset_in_owner_order():
    parts = split(2, min_samples=2, max_clients=2)
    assert len(parts) == 2
    kept = [set(OWNERS[p]) for p in parts]
    assert all(len(k) == 1 for k in kept) and kept[0] != kept[1]
    assert [p.tolist() for p in parts] == [
        p.tolist() for p in split(2, min_samples=2, max_clients=2)
    ]
    assert sorted(OWNERS[p[0]] for p in parts) == [OWNERS[p[0]] for p in parts]


def test_fewer_owners_than_clients_give_a_client_per_owner():
    # 3 owners with >= 2 samples (a, b, d); num_clients=5 asks for more: the 3 there are
    assert [p.tolist() for p in split(5, min_samples=2)] == [[1, 4], [0, 2, 5], [6, 7]]
    assert natural_clients(5, OWNERS, min_samples=2, max_clients=None) == 3
    assert natural_clients(5, OWNERS, min_samples=2, max_clients=2) == 2
    assert natural_clients(2, OWNERS, min_samples=0, max_clients=2) == 2


def test_count_mismatch_and_missing_ids_are_one_line_errors():
    # every owner a client (max_clients null), but more owners than num_clients: no pick
    with pytest.raises(ConfigError, match=r"^num_clients: the natural split has 3 clients .*got 2"):
        split(2, min_samples=2)
    with pytest.raises(ConfigError, match=r"^partition.min_samples: no owner of the 4 has >= 4"):
        split(2, min_samples=4)
    with pytest.raises(
        ConfigError, match=r"^partition: natural split needs a dataset .*dataset.client_key="
    ):
        natural(np.zeros(4), 2, np.random.default_rng(0), None)
