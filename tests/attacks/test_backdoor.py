"""The backdoor attack (attack=backdoor): the trigger's pixels, the poisoned rows, the upload boost
and the attack success rate, each by hand on a few tensors."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

from components import with_yaml
from fedexp.attacks import NoAttack
from fedexp.attacks.backdoor import (
    Backdoor,
    poison_count,
    poisoned_rows,
    stamp,
    trigger_mask,
    trigger_value,
)
from fedexp.core.cohort import RoundResults
from fedexp.core.types import ClientResult, ConfigError, Ranking, RoundContext, Weights
from fedexp.engine.eval.backdoor import backdoor_metrics, success_rate

Backdoor = with_yaml(Backdoor, "attack", "backdoor")


def images(n=4, value=0.0):
    """n one-channel 4x4 images of `value`, with one pixel at 2.0 (the data's largest value)."""
    x = torch.full((n, 1, 4, 4), value)
    x[0, 0, 3, 3] = 2.0
    return x


def data_of(x, y, num_classes=3, clients=None, name="toy"):
    """What the attack reads of FederatedData: inputs, their shape, classes, each client's
    training slice (`clients`: client -> its rows)."""
    clients = clients or {0: list(range(len(y)))}
    return SimpleNamespace(
        x=x,
        y=y,
        input_shape=tuple(x.shape[1:]),
        num_classes=num_classes,
        dataset=SimpleNamespace(name=name),
        train=lambda c: (x[clients[c]], y[clients[c]]),
    )


def set_up(attack, data, num_clients=2, malicious=None):
    attack.setup(SimpleNamespace(seed=0, aggregator=None, data=data), num_clients)
    if malicious is not None:
        attack.malicious = frozenset(malicious)
    return attack


def test_the_yaml_holds_bagdasaryans_share_and_no_replacement():
    attack = Backdoor(0.2)
    assert attack.poison_fraction == 20 / 64 and attack.boost == 1.0
    assert (attack.target_label, attack.trigger, attack.trigger_size) == (0, "square", 3)
    assert attack.targets is None  # poisoned data reaches any algorithm


def test_trigger_masks_exact_pixels():
    square = trigger_mask((1, 4, 4), "square", 2, "top_left")
    assert square[0].nonzero().tolist() == [[0, 0], [0, 1], [1, 0], [1, 1]]
    plus = trigger_mask((2, 5, 5), "plus", 3, "bottom_right")
    # the box is rows 2..4, columns 2..4; its middle row 3 and middle column 3
    assert plus[0].nonzero().tolist() == [[2, 3], [3, 2], [3, 3], [3, 4], [4, 3]]
    assert torch.equal(plus[0], plus[1])  # every channel
    assert trigger_mask((6,), "square", 2, "top_right").tolist() == [0, 0, 0, 0, 1, 1]
    assert trigger_mask((6,), "square", 2, "bottom_left").tolist() == [1, 1, 0, 0, 0, 0]


def test_stamp_puts_the_channels_largest_value_on_the_mask_only():
    x = torch.zeros(2, 2, 3, 3)
    x[1, 0, 2, 2], x[0, 1, 1, 1] = 1.75, 3.0  # channel maxima 1.75 and 3.0
    value = trigger_value(x)
    assert value.flatten().tolist() == [1.75, 3.0]
    out = stamp(x, trigger_mask((2, 3, 3), "square", 1, "top_left"), value)
    assert out[:, 0, 0, 0].tolist() == [1.75, 1.75] and out[:, 1, 0, 0].tolist() == [3.0, 3.0]
    out[:, :, 0, 0] = x[:, :, 0, 0]
    assert torch.equal(out, x)  # nothing else changed
    assert trigger_value(torch.tensor([[0.5, -1.0], [2.5, 0.0]])).item() == 2.5  # vectors


def test_poison_fraction_of_a_batch_of_ten():
    # floor(f·10 + 1/2): 20/64 -> 3.125 -> 3; 0.25 -> 2.5 -> 3 (halves up); 0.2 -> 2; 1 -> 10
    assert [poison_count(10, f) for f in (20 / 64, 0.25, 0.2, 1.0)] == [3, 3, 2, 10]
    rows = poisoned_rows(10, 20 / 64, seed=0, client_id=4)
    assert len(rows) == 3 == len(set(rows.tolist())) and rows.tolist() == sorted(rows.tolist())
    assert np.array_equal(rows, poisoned_rows(10, 20 / 64, seed=0, client_id=4))  # every round


def test_a_malicious_client_trains_on_exactly_its_poisoned_rows():
    x, y = images(10), torch.full((10,), 2)
    x[0, 0, 3, 3] = 0.0
    x[:, :, 1:, 1:] = 0.5  # the training samples: 0.5 outside the trigger's 1x1 corner
    x[5, 0, 3, 3] = 2.0
    data = data_of(x, y, clients={0: list(range(5)), 1: list(range(5, 10))})
    attack = Backdoor(0.5, trigger_size=1, poison_fraction=0.25)
    set_up(attack, data, malicious={1})
    view = attack.wrap_data(data)
    hx, hy = view.train(0)
    assert torch.equal(hx, x[:5]) and torch.equal(hy, y[:5])  # honest: untouched
    px, py = view.train(1)
    rows = poisoned_rows(5, 0.25, 0, 1).tolist()  # floor(1.25 + 0.5) = 1 of 5
    assert len(rows) == 1 and py.tolist() == [0 if i in rows else 2 for i in range(5)]
    assert px[rows, 0, 0, 0].tolist() == [2.0]  # the data's largest value, in the corner
    changed = (px != x[5:]).nonzero().tolist()
    assert changed == [[rows[0], 0, 0, 0]]  # one pixel of one sample
    many_x, many_y, sizes = view.train_many([0, 1])
    assert sizes == [5, 5] and torch.equal(many_x, torch.cat([hx, px]))
    assert torch.equal(many_y, torch.cat([hy, py]))


def results_of(uploads, ids):
    return RoundResults.of([ClientResult(c, 10, u, 0.0, 1) for c, u in zip(ids, uploads)])


def test_boost_scales_the_malicious_updates_for_model_replacement():
    data = data_of(images(), torch.tensor([0, 1, 2, 1]))
    ctx = RoundContext(1, (0, 1), 0)
    uploads = [Weights(torch.tensor([1.0, -2.0]))] * 2
    plain = set_up(Backdoor(0.5), data, malicious={1}).apply(results_of(uploads, [0, 1]), ctx)
    assert [r.upload.values.tolist() for r in plain] == [[1, -2], [1, -2]]
    assert [r.malicious for r in plain] == [False, True]  # flagged, unchanged
    boosted = set_up(Backdoor(0.5, boost=10.0), data, malicious={1})
    out = boosted.apply(results_of(uploads, [0, 1]), ctx)
    assert [r.upload.values.tolist() for r in out] == [[1, -2], [10, -20]]
    frl_like = SimpleNamespace(upload_type=Ranking, clients_train=True)
    Backdoor(0.2).check_target(frl_like)  # data poisoning: any upload
    with pytest.raises(ConfigError, match="backdoor cannot target"):
        Backdoor(0.2, boost=10.0).check_target(frl_like)


class PixelRule(nn.Module):
    """Predicts class 0 when pixel `at` exceeds 1 (times `scale`), else class 1."""

    def __init__(self, at=(0, 0), scale=1.0):
        super().__init__()
        self.at = at
        self.scale = nn.Parameter(torch.tensor(scale))

    def forward(self, x):
        on = (x[..., 0, self.at[0], self.at[1]] > 1).float() * self.scale
        return torch.stack([10 * on, torch.full_like(on, 5.0), torch.zeros_like(on)], -1)


def test_attack_success_rate_by_hand():
    x, y = images(4), torch.tensor([0, 1, 2, 0])
    attack = set_up(Backdoor(0.5, trigger_size=1), data_of(x, y))
    # predicts the target whenever the trigger pixel is on: every triggered non-target input
    assert success_rate(PixelRule((0, 0)), attack, x, y) == 1.0
    # a pixel the trigger leaves alone (off in every input): never the target
    assert success_rate(PixelRule((2, 2)), attack, x, y) == 0.0
    # on in inputs 0, 1 and 3 only: of the non-target inputs 1 and 2 one succeeds -> 1/2; the
    # target-labelled inputs 0 and 3 are left out (with them it would be 3/4)
    x[[0, 1, 3], 0, 1, 1] = 2.0
    assert success_rate(PixelRule((1, 1)), attack, x, y) == 0.5
    triggered = attack.poisoned_test(x, y)
    assert triggered[0].tolist() == [False, True, True, False]
    assert triggered[2].tolist() == [0, 0] and triggered[1][:, 0, 0, 0].tolist() == [2.0, 2.0]


def test_backdoor_metrics_global_and_personal_models():
    # three clients' local test splits; client 2 is malicious (its own model left out)
    x, y = images(5), torch.tensor([1, 2, 0, 1, 1])
    owners = torch.tensor([0, 0, 1, 1, 2])
    data = data_of(x, y, clients={0: [0], 1: [1], 2: [2]})
    data.num_clients, data.test_x, data.test_y = 3, x, y
    data.local_index = lambda split: (torch.arange(5), np.array([0, 2, 4, 5]))
    data.owners = lambda split: owners
    attack = set_up(Backdoor(0.3, trigger_size=1), data, num_clients=3, malicious={2})
    models = {0: PixelRule(scale=1.0), 1: PixelRule(scale=0.0), 2: PixelRule(scale=1.0)}
    algorithm = SimpleNamespace(
        global_model=lambda state: PixelRule(scale=1.0),
        personal_models=lambda state, ids: None,
        personal_model=lambda state, c: models[c],
    )
    metrics = backdoor_metrics(attack, algorithm, None, data)
    # client 0 succeeds on both its inputs, client 1 on none of its one non-target input
    assert metrics == pytest.approx(
        {"attack/backdoor_asr": 1.0, "attack/backdoor_asr_personal": 0.5}
    )
    assert backdoor_metrics(NoAttack(0.0, False), algorithm, None, data) == {}
    no_personal = SimpleNamespace(**{**vars(algorithm), "personal_model": lambda s, c: None})
    assert backdoor_metrics(attack, no_personal, None, data) == {"attack/backdoor_asr": 1.0}


@pytest.mark.parametrize(
    "options, key",
    [
        ({"poison_fraction": 0}, "attack.poison_fraction"),
        ({"poison_fraction": 1.5}, "attack.poison_fraction"),
        ({"trigger": "star"}, "attack.trigger"),
        ({"trigger_size": 0}, "attack.trigger_size"),
        ({"trigger": "plus", "trigger_size": 2}, "attack.trigger_size"),
        ({"corner": "middle"}, "attack.corner"),
        ({"boost": 0}, "attack.boost"),
        ({"target_label": -1}, "attack.target_label"),
        ({"target_label": True}, "attack.target_label"),
    ],
)
def test_bad_options_are_one_line_config_errors(options, key):
    with pytest.raises(ConfigError, match=key) as err:
        Backdoor(0.2, **options)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    "options, x, key",
    [
        ({"target_label": 3}, torch.zeros(4, 1, 4, 4), "attack.target_label: 3, but toy has 3"),
        ({"trigger_size": 5}, torch.zeros(4, 1, 4, 4), "attack.trigger_size: 5 does not fit"),
        ({"trigger": "plus"}, torch.zeros(4, 8), "attack.trigger: plus needs image inputs"),
        ({}, torch.zeros(4, 8, dtype=torch.long), "attack=backdoor stamps a trigger"),
    ],
)
def test_data_the_trigger_cannot_go_on_is_refused_at_set_up(options, x, key):
    with pytest.raises(ConfigError, match=key) as err:
        set_up(Backdoor(0.5, **options), data_of(x, torch.zeros(4, dtype=torch.long)))
    assert "\n" not in str(err.value)
