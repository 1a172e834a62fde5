"""partition.reduce_fraction/reduce_factor: a random fraction of clients keeps part of its data."""

from __future__ import annotations

import numpy as np
import pytest

from components import partition_dataset
from fedexp.core.types import ConfigError

LABELS = np.repeat(np.arange(10), 40)  # 400 samples, 40 per class


def split(**reduce):
    return partition_dataset(LABELS, 10, "iid", seed=3, params=dict(reduce), test_fraction=0.25)


def test_defaults_leave_the_partition_unchanged():
    plain, explicit = split(), split(reduce_fraction=0.0, reduce_factor=1.0)
    for a, b in zip(plain.train + plain.test, explicit.train + explicit.test):
        np.testing.assert_array_equal(a, b)


def test_half_of_the_clients_keep_half_of_their_training_data():
    plain, reduced = split(), split(reduce_fraction=0.5, reduce_factor=0.5)
    shrunk = [c for c in range(10) if len(reduced.train[c]) < len(plain.train[c])]
    assert len(shrunk) == 5
    for c in range(10):
        np.testing.assert_array_equal(reduced.test[c], plain.test[c])  # test splits untouched
        if c in shrunk:
            # 40 samples, 10 local test -> 30 train -> 15 kept, all from the client's own
            assert len(reduced.train[c]) == 15
            assert set(reduced.train[c]) <= set(plain.train[c])
        else:
            np.testing.assert_array_equal(reduced.train[c], plain.train[c])
    again = split(reduce_fraction=0.5, reduce_factor=0.5)  # seeded
    for a, b in zip(reduced.train, again.train):
        np.testing.assert_array_equal(a, b)


def test_every_client_reduced_keeps_at_least_one_sample():
    reduced = split(reduce_fraction=1.0, reduce_factor=0.001)
    assert [len(t) for t in reduced.train] == [1] * 10


@pytest.mark.parametrize(
    "reduce", [{"reduce_fraction": 1.5}, {"reduce_fraction": -0.1}, {"reduce_factor": 0.0}]
)
def test_bad_values_are_config_errors(reduce):
    with pytest.raises(ConfigError, match="partition.reduce_"):
        split(**reduce)
