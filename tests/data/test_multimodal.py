"""The multimodal partition: two client groups with disjoint classes, equal client sizes."""

from __future__ import annotations

import numpy as np
import pytest

from components import partition_dataset, with_yaml
from fedexp.core.types import ConfigError
from fedexp.data.partition import multimodal

multimodal = with_yaml(multimodal, "partition", "multimodal")

LABELS = np.repeat(np.arange(10), 100)  # 10 classes x 100 samples


def split(**params):
    return multimodal(LABELS, 12, np.random.default_rng(0), **params)


def test_group_sizes_class_sets_and_equal_samples():
    parts, groups = split()
    assert groups.count("majority") == 10 and groups.count("minority") == 2  # 5 : 1
    for part, group in zip(parts, groups):
        classes = set(np.unique(LABELS[part]).tolist())
        assert len(classes) == 2
        assert classes <= ({1, 3, 5, 7, 9} if group == "majority" else {0, 2, 4, 6, 8})
        # 10 majority clients x 2 = 20 shards over 5 odd classes: 4 of 25 per class
        assert np.bincount(LABELS[part]).max() == 25
    assert {len(p) for p in parts} == {50}
    used = np.concatenate(parts)
    assert len(np.unique(used)) == len(used) == 600  # no sample twice; the rest unused


@pytest.mark.parametrize("seed", range(3))
def test_each_group_deals_varied_class_pairs(seed):
    labels = np.repeat(np.arange(10), 200)
    parts, groups = multimodal(labels, 300, np.random.default_rng(seed))  # 250 : 50 clients
    pairs = {"majority": set(), "minority": set()}
    for part, group in zip(parts, groups):
        pair = tuple(np.unique(labels[part]).tolist())
        assert len(pair) == 2  # two distinct classes, never one twice
        assert set(pair) <= ({1, 3, 5, 7, 9} if group == "majority" else {0, 2, 4, 6, 8})
        pairs[group].add(pair)
    # 10 possible pairs per group; a cyclic layout over the group's classes gives 5
    assert len(pairs["majority"]) >= 8 and len(pairs["minority"]) >= 8
    assert len({len(p) for p in parts}) == 1
    used = np.concatenate(parts)
    assert len(np.unique(used)) == len(used)


def test_explicit_class_sets_and_samples_per_client():
    parts, groups = split(
        majority_classes=[0, 1, 2], minority_classes=[7, 8], samples_per_client=20
    )
    assert {len(p) for p in parts} == {20}
    for part, group in zip(parts, groups):
        assert set(LABELS[part]) <= ({0, 1, 2} if group == "majority" else {7, 8})


def test_impossible_requests_are_config_errors():
    with pytest.raises(ConfigError, match="samples_per_client"):
        split(samples_per_client=200)
    with pytest.raises(ConfigError, match="majority_classes"):
        split(majority_classes=[1, 2], minority_classes=[2, 4])
    with pytest.raises(ConfigError, match="group_ratio"):
        multimodal(LABELS, 3, np.random.default_rng(0), group_ratio=5)


def test_groups_survive_the_partition_cache(tmp_path):
    def run():
        return partition_dataset(
            LABELS, 12, "multimodal", 0, {"classes_per_client": 2}, cache_dir=tmp_path
        )

    first, cached = run(), run()
    assert list((tmp_path / "partitions").iterdir())
    assert cached.groups == first.groups and first.groups.count("minority") == 2
    assert all(np.array_equal(a, b) for a, b in zip(first.train, cached.train))
