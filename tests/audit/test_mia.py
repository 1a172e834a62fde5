"""The membership-inference attack: beats chance on an overfit model, not on a random one; the
shadows' label-matched in / out sets."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fedexp.audit.mia import attack_accuracy, attack_features, fit_attack, mimic_split

DIM, CLASSES, N = 20, 10, 60


def data(seed: int):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(2 * N, DIM, generator=g), torch.randint(0, CLASSES, (2 * N,), generator=g)


def model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(DIM, 64), nn.ReLU(), nn.Linear(64, CLASSES))


def overfit(net: nn.Module, x, y) -> nn.Module:
    """Memorise random labels: what membership inference feeds on."""
    opt = torch.optim.Adam(net.parameters(), lr=0.01)
    for _ in range(80):
        opt.zero_grad()
        F.cross_entropy(net(x), y).backward()
        opt.step()
    return net


def trained_attack():
    ins, outs = [], []
    for k in range(3):  # three shadow models, as in the WAFFLe paper
        x, y = data(10 + k)
        shadow = overfit(model(k), x[:N], y[:N])
        ins.append(attack_features(shadow, x[:N], y[:N]))
        outs.append(attack_features(shadow, x[N:], y[N:]))
    return fit_attack(np.concatenate(ins), np.concatenate(outs), "gbdt", 0)


def test_attack_beats_chance_on_an_overfit_model_and_not_on_a_random_one():
    attack = trained_attack()
    x, y = data(99)
    target = overfit(model(99), x[:N], y[:N])
    acc = attack_accuracy(
        attack, attack_features(target, x[:N], y[:N]), attack_features(target, x[N:], y[N:])
    )
    assert acc > 0.8
    untrained = model(123)
    acc = attack_accuracy(
        attack, attack_features(untrained, x[:N], y[:N]), attack_features(untrained, x[N:], y[N:])
    )
    assert abs(acc - 0.5) < 0.1


def test_features_are_sorted_probabilities_and_true_label_log_probability():
    net = nn.Linear(2, 3, bias=False)
    with torch.no_grad():
        net.weight.copy_(torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 0.0]]))
    feats = attack_features(net, torch.tensor([[float(np.log(2.0)), 0.0]]), torch.tensor([0]))
    # logits (0, log 2, 0): softmax (1/4, 1/2, 1/4)
    assert np.allclose(feats, [[0.5, 0.25, 0.25, np.log(0.25)]])


def test_shadow_sets_follow_the_targets_label_histogram():
    pool = np.array([0] * 10 + [1] * 4 + [2] * 10)
    ins, outs = mimic_split(np.random.default_rng(0), pool, np.array([0, 0, 1]), cap=100)
    assert sorted(pool[ins]) == [0, 0, 1] and sorted(pool[outs]) == [0, 0, 1]
    assert not set(ins) & set(outs)
    # 8 + 8 wanted; label 1 has 4 in the pool (2 in, 2 out): both labels scale to 2
    ins, outs = mimic_split(np.random.default_rng(0), pool, np.array([0] * 8 + [1] * 8), cap=100)
    assert sorted(pool[ins]) == [0, 0, 1, 1] and sorted(pool[outs]) == [0, 0, 1, 1]
    # the cap scales evenly: 4 : 2 of 6 -> 2 : 1 of 3
    ins, _ = mimic_split(np.random.default_rng(0), pool, np.array([0] * 4 + [2] * 2), cap=3)
    assert sorted(pool[ins]) == [0, 0, 2]
    # a label the pool lacks is left out; none at all: empty sets
    ins, _ = mimic_split(np.random.default_rng(0), pool, np.array([0, 7]), cap=100)
    assert sorted(pool[ins]) == [0]
    ins, outs = mimic_split(np.random.default_rng(0), pool, np.array([7]), cap=100)
    assert len(ins) == len(outs) == 0
