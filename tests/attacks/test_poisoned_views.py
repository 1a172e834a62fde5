"""Data-poisoning views give a batched executor's gather (`train_many`, the vectorized executor's
`cohort_train_data`) exactly what `train` gives each client: the malicious clients' poisoned
samples, not the real data's."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from components import with_yaml
from fedexp.attacks.backdoor import Backdoor
from fedexp.attacks.label_flip import LabelFlip
from fedexp.engine.executors.batched_round import cohort_train_data

X = torch.arange(6 * 16, dtype=torch.float32).reshape(6, 1, 4, 4) / 100
Y = torch.tensor([0, 1, 2, 1, 0, 2])
ROWS = {0: [0, 1, 2], 1: [3, 4, 5]}


def real_data():
    """Clients 0 and 1, three samples each, with the real data's own gather (`train_many`)."""

    def train_many(ids):
        rows = [r for c in ids for r in ROWS[c]]
        return X[rows], Y[rows], [len(ROWS[c]) for c in ids]

    return SimpleNamespace(
        x=X,
        num_classes=3,
        input_shape=(1, 4, 4),
        train=lambda c: (X[ROWS[c]], Y[ROWS[c]]),
        train_many=train_many,
    )


@pytest.mark.parametrize(
    "attack",
    [
        with_yaml(LabelFlip, "attack", "label_flip")(0.5),
        with_yaml(Backdoor, "attack", "backdoor")(0.5, trigger_size=1, poison_fraction=1.0),
    ],
    ids=["label_flip", "backdoor"],
)
def test_the_batched_gather_sees_the_poisoned_samples(attack):
    data = real_data()
    attack.setup(SimpleNamespace(seed=0, aggregator=None, data=data), 2)
    attack.malicious = frozenset({1})
    view = attack.wrap_data(data)
    x, y, sizes = cohort_train_data(view, [0, 1])
    assert sizes == [3, 3]
    assert torch.equal(y[:3], Y[:3]) and torch.equal(x[:3], X[:3])  # the honest client
    poisoned_x, poisoned_y = view.train(1)
    assert torch.equal(y[3:], poisoned_y) and torch.equal(x[3:], poisoned_x)
    assert not torch.equal(poisoned_y, Y[3:])  # flipped [1, 0, 2] -> [1, 2, 0]; or all 0
