import numpy as np
import pytest

from fedexp.core.types import ConfigError
from fedexp.data.partition import dirichlet, iid, partition_dataset, shards

LABELS = np.repeat(np.arange(10), 50)  # 10 classes x 50 samples


def rng(seed=0):
    return np.random.default_rng(seed)


@pytest.mark.parametrize("z", [1, 2, 3])
def test_shards_give_exactly_z_labels_and_use_each_sample_once(z):
    parts = shards(LABELS, 20, rng(), classes_per_client=z)
    assert [len(np.unique(LABELS[p])) for p in parts] == [z] * 20
    flat = np.concatenate(parts)
    assert len(flat) == len(np.unique(flat)) == 500  # every sample used exactly once here


def test_shards_reject_more_classes_than_the_dataset_has():
    with pytest.raises(ConfigError, match="classes_per_client: 11 exceeds"):
        shards(LABELS, 5, rng(), classes_per_client=11)


def test_iid_sizes_differ_by_at_most_one():
    sizes = [len(p) for p in iid(LABELS, 7, rng())]
    assert max(sizes) - min(sizes) <= 1 and sum(sizes) == 500


def test_dirichlet_is_deterministic_per_seed_and_disjoint():
    a = dirichlet(LABELS, 5, rng(3), beta=0.5, min_size=5)
    b = dirichlet(LABELS, 5, rng(3), beta=0.5, min_size=5)
    c = dirichlet(LABELS, 5, rng(4), beta=0.5, min_size=5)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c))
    flat = np.concatenate(a)
    assert len(flat) == len(np.unique(flat)) == 500


def test_dirichlet_gives_up_with_a_clear_error():
    with pytest.raises(ConfigError, match="partition.min_size: no Dirichlet"):
        dirichlet(LABELS, 50, rng(), beta=0.01, min_size=10, max_retries=3)


def test_local_split_and_cache(tmp_path):
    kw = dict(
        labels=LABELS,
        num_clients=10,
        scheme="shards",
        seed=1,
        params={"classes_per_client": 2},
        test_fraction=0.2,
        cache_dir=tmp_path,
    )
    first = partition_dataset(**kw)
    assert len(list((tmp_path / "partitions").glob("*.npz"))) == 1
    second = partition_dataset(**kw)  # served from the cache
    for a, b, c, d in zip(first.train, second.train, first.test, second.test):
        assert np.array_equal(a, b) and np.array_equal(c, d)
        assert len(np.intersect1d(a, c)) == 0
        assert len(c) == 10 and len(a) == 40  # 50 samples per client, 20 % local test


def test_empty_local_test_splits_are_left_out_of_the_spread():
    from fedexp.core.evaluation import distribution

    spread = distribution("eval/personal", np.array([0.5, np.nan, 1.0]))
    assert spread["eval/personal/acc_mean"] == 0.75 and spread["eval/personal/acc_min"] == 0.5
