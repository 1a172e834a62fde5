import numpy as np
import pytest

from components import partition_dataset, with_yaml
from fedexp.core.types import ConfigError
from fedexp.data.partition import dirichlet, iid, shards

shards = with_yaml(shards, "partition", "shards")
dirichlet = with_yaml(dirichlet, "partition", "dirichlet")

LABELS = np.repeat(np.arange(10), 50)  # 10 classes x 50 samples


def rng(seed=0):
    return np.random.default_rng(seed)


@pytest.mark.parametrize("z", [1, 2, 3])
def test_shards_give_exactly_z_labels_and_use_each_sample_once(z):
    parts = shards(LABELS, 20, rng(), classes_per_client=z)
    assert [len(np.unique(LABELS[p])) for p in parts] == [z] * 20
    flat = np.concatenate(parts)
    assert len(flat) == len(np.unique(flat)) == 500  # every sample used exactly once here


def class_sets(labels, parts):
    return [tuple(np.unique(labels[p]).tolist()) for p in parts]


# (classes, samples per class, clients, Z, least distinct class sets): McMahan's random deal of
# 100 clients x 2 of 10 classes gives ~40 of the 45 pairs; Z=5 ~85 of 252 sets; CIFAR-100-sized
# labels with Z=5 nearly 100 distinct sets. A cyclic layout gives 5, 2 and 20.
VARIETY = [(10, 60, 100, 2, 30), (10, 60, 100, 5, 40), (100, 10, 100, 5, 95)]


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize(("c", "per_class", "n", "z", "least"), VARIETY)
def test_shards_deal_varied_class_sets_label_exact(c, per_class, n, z, least, seed):
    labels = np.random.default_rng(99).permutation(np.repeat(np.arange(c), per_class))
    parts = shards(labels, n, rng(seed), classes_per_client=z)
    sets = class_sets(labels, parts)
    assert len(set(sets)) >= least
    assert all(len(s) == z for s in sets)  # Z distinct classes, none twice
    flat = np.concatenate(parts)
    assert len(flat) == len(np.unique(flat)) == c * per_class  # each sample exactly once
    owners = np.array([sum(cls in s for s in sets) for cls in range(c)])
    assert owners.sum() == n * z and owners.max() - owners.min() <= 1  # shards per class
    for cls in range(c):  # a class's shards differ by at most one sample
        sizes = [np.sum(labels[p] == cls) for p in parts if cls in labels[p]]
        assert max(sizes) - min(sizes) <= 1


def test_shards_with_fewer_slots_than_classes_use_each_class_at_most_once():
    labels = np.repeat(np.arange(10), 5)
    parts = shards(labels, 3, rng(), classes_per_client=2)  # 6 slots over 10 classes
    sets = class_sets(labels, parts)
    used = [cls for s in sets for cls in s]
    assert all(len(s) == 2 for s in sets) and len(used) == len(set(used)) == 6
    assert sorted(len(p) for p in parts) == [10, 10, 10]  # a whole class per slot


def test_shards_are_deterministic_per_seed():
    a, b, c = (shards(LABELS, 20, rng(s), classes_per_client=2) for s in (5, 5, 6))
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert class_sets(LABELS, a) != class_sets(LABELS, c)


@pytest.mark.parametrize("seed", range(3))
def test_blind_cut_deals_equal_label_sorted_shards(seed):
    labels = np.random.default_rng(7).integers(0, 10, 5003)  # uneven classes: shards straddle
    parts = shards(labels, 100, rng(seed), classes_per_client=2, exact=False)
    assert {len(p) for p in parts} == {50}  # 200 shards of 5003 // 200 = 25 samples
    flat = np.concatenate(parts)
    assert len(np.unique(flat)) == len(flat) == 5000  # the last 3 sorted samples unused
    assert np.array_equal(np.sort(labels[flat]), np.sort(labels)[:5000])
    assert len(set(class_sets(labels, parts))) >= 30


def test_blind_cut_can_give_a_client_one_class_twice():
    counts = []
    for seed in range(10):  # 20 shards of 25 samples, two per class, over 10 clients
        parts = shards(LABELS, 10, rng(seed), classes_per_client=2, exact=False)
        assert {len(p) for p in parts} == {50}
        counts += [len(np.unique(LABELS[p])) for p in parts]
    assert set(counts) == {1, 2}  # shards never straddle here; some client got one class twice


def test_shards_reject_more_classes_than_the_dataset_has():
    with pytest.raises(ConfigError, match="classes_per_client: 11 exceeds"):
        shards(LABELS, 5, rng(), classes_per_client=11)


@pytest.mark.parametrize(
    ("params", "match"),
    [
        ({"classes_per_client": 0}, "partition.classes_per_client: must be an integer >= 1"),
        ({"classes_per_client": 2.5}, "partition.classes_per_client: must be an integer"),
        ({"exact": "no"}, "partition.exact: must be true or false"),
    ],
)
def test_shards_reject_bad_options(params, match):
    with pytest.raises(ConfigError, match=match):
        shards(LABELS, 5, rng(), **params)


def test_blind_cut_rejects_empty_shards():
    with pytest.raises(ConfigError, match="partition.classes_per_client: 600 shards"):
        shards(LABELS, 300, rng(), classes_per_client=2, exact=False)


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
    from fedexp.engine.eval.all_clients import distribution

    spread = distribution("eval/personal", np.array([0.5, np.nan, 1.0]))
    assert spread["eval/personal/acc_mean"] == 0.75 and spread["eval/personal/acc_min"] == 0.5
