"""`dataset.max_samples` (`fedexp.data.subset`): a seeded subset of the training and test sets,
whole owners where the data have them; `debug=smoke` caps any dataset at 2000 + 2000."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tests.conftest import smoke_experiment

from fedexp.data.datasets import Dataset
from fedexp.data.subset import cap_samples


def dataset(n_train: int, n_test: int, owners=None) -> Dataset:
    """Input i is the number i (so kept rows can be read off the inputs); label i % 2."""
    x = torch.arange(n_train, dtype=torch.float32)[:, None]
    tx = torch.arange(100, 100 + n_test, dtype=torch.float32)[:, None]
    y, ty = torch.arange(n_train) % 2, torch.arange(n_test) % 2
    ids = None if owners is None else np.asarray(owners)
    return Dataset("d", x, y, tx, ty, 2, (1,), train_client_ids=ids)


def test_a_seeded_subset_of_train_and_test_rows_in_their_order():
    kept = cap_samples(dataset(10, 6), 4, seed=0, num_clients=2)
    rows = kept.train_x[:, 0].long()
    assert len(rows) == 4 and rows.tolist() == sorted(rows.tolist())
    assert kept.train_y.tolist() == (rows % 2).tolist()  # labels stay with their inputs
    assert len(kept.test_y) == 4 and kept.test_y.tolist() == (kept.test_x[:, 0].long() % 2).tolist()
    again = cap_samples(dataset(10, 6), 4, seed=0, num_clients=2)
    assert torch.equal(again.train_x, kept.train_x) and torch.equal(again.test_x, kept.test_x)
    assert not torch.equal(cap_samples(dataset(10, 6), 4, 1, 2).train_x, kept.train_x)


def test_no_cap_or_a_cap_above_the_sizes_keeps_the_dataset():
    full = dataset(10, 6)
    assert cap_samples(full, None, 0, 2) is full and cap_samples(full, 10, 0, 2) is full


def test_owners_are_kept_whole_and_never_fewer_than_the_clients():
    owners = [0, 0, 0, 1, 1, 2, 2, 2, 2, 3]  # sizes 3, 2, 4, 1
    kept = cap_samples(dataset(10, 0, owners), 5, seed=0, num_clients=1)
    sizes = {0: 3, 1: 2, 2: 4, 3: 1}
    held = np.unique(kept.train_client_ids, return_counts=True)
    assert all(sizes[o] == c for o, c in zip(*held))  # every kept owner with all its rows
    assert 1 <= held[1].sum() <= 5
    rows = kept.train_x[:, 0].long().numpy()
    assert (np.asarray(owners)[rows] == kept.train_client_ids).all()
    # 3 clients asked: at least 3 owners, whatever the cap
    assert len(np.unique(cap_samples(dataset(10, 0, owners), 1, 0, 3).train_client_ids)) == 3


@pytest.mark.experiment
def test_smoke_caps_a_larger_dataset_at_2000_training_and_2000_test_samples(tmp_path):
    root = tmp_path / "big"
    root.mkdir()
    for split, n in (("train", 2500), ("test", 2100)):
        rows = "\n".join(f"{i},{i % 2}" for i in range(n))
        (root / f"{split}.csv").write_text(f"a,y\n{rows}\n")
    exp = smoke_experiment(
        tmp_path, "dataset=hf", f"dataset.path={root}", "dataset.feature_keys=[a]",
        "dataset.label_key=y",
    )  # fmt: skip
    data = exp.data.dataset
    assert len(data.test_y) == 2000
    # the cap comes before the server pool (none for FedAvg: `partition.server_pool: auto`)
    pooled = 0 if data.server_x is None else len(data.server_x)
    assert len(data.train_y) + pooled == 2000
