"""Inner-product manipulation (attack=ipm): the crafted upload and the aggregates, by hand."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from components import with_yaml
from fedexp.aggregators.mean import weighted_mean
from fedexp.aggregators.median import median
from fedexp.attacks.ipm import IPM, ipm_update
from fedexp.core.cohort import RoundResults
from fedexp.core.types import ClientResult, ConfigError, RoundContext, Signs, Weights

IPM = with_yaml(IPM, "attack", "ipm")
CTX = RoundContext(1, (0, 1, 2), 0)


def set_up(attack, num_clients):
    attack.setup(SimpleNamespace(seed=0, aggregator=None), num_clients)
    return attack


def round_of(vectors, ids):
    uploads = [Weights(torch.tensor(v, dtype=torch.float32)) for v in vectors]
    return RoundResults.of([ClientResult(c, 10, u, 0.0, 1) for c, u in zip(ids, uploads)])


def test_the_yaml_holds_the_papers_small_epsilon_and_the_omniscient_attacker():
    attack = IPM(0.2)
    assert attack.epsilon == 0.1 and attack.knowledge == "honest"


def test_every_attacker_uploads_minus_epsilon_times_the_honest_mean():
    # honest [1, 2] and [3, 4]: mean [2, 3]; ε = 0.5 -> [-1, -1.5], whatever the attacker trained
    attack = set_up(IPM(1 / 3, epsilon=0.5), num_clients=3)
    (bad,) = attack.malicious
    honest = [c for c in range(3) if c != bad]
    out = attack.apply(round_of([[1, 2], [3, 4], [100, -100]], [*honest, bad]), CTX)
    assert out[2].upload.values.tolist() == [-1.0, -1.5] and out[2].malicious
    assert [r.upload.values.tolist() for r in out][:2] == [[1, 2], [3, 4]]
    assert not out[0].malicious and attack.round_metrics(out)["attack/known"] == 2
    assert ipm_update(torch.tensor([[1.0, 2.0], [3.0, 4.0]]), 0.5).tolist() == [-1.0, -1.5]


def test_knowledge_all_counts_the_attackers_own_benign_updates():
    # every update known: mean of [1, 2], [3, 4], [5, 6] = [3, 4]; ε = 0.5 -> [-1.5, -2]
    attack = set_up(IPM(1 / 3, epsilon=0.5, knowledge="all"), num_clients=3)
    (bad,) = attack.malicious
    honest = [c for c in range(3) if c != bad]
    out = attack.apply(round_of([[1, 2], [3, 4], [5, 6]], [*honest, bad]), CTX)
    assert out[2].upload.values.tolist() == [-1.5, -2.0]


def test_a_round_without_honest_clients_uses_the_attackers_benign_updates():
    attack = set_up(IPM(0.5, epsilon=1.0), num_clients=2)
    bad = sorted(attack.malicious)
    out = attack.apply(round_of([[2, 0]], bad), CTX)
    assert out[0].upload.values.tolist() == [-2.0, 0.0]


def test_the_mean_of_benign_and_malicious_uploads_by_hand():
    # n_b honest uploads of mean g and n_m copies of -ε g: uniform mean (n_b - ε n_m)/(n_b + n_m) g
    # = (1 - ε n_m / n_b) · n_b / (n_b + n_m) · g. n_b = 2, n_m = 1, ε = 0.5, g = [2, 3]:
    # (1 - 0.25) · 2/3 · [2, 3] = [1, 1.5]; reversed only for ε > n_b / n_m = 2
    attack = set_up(IPM(1 / 3, epsilon=0.5), num_clients=3)
    (bad,) = attack.malicious
    honest = [c for c in range(3) if c != bad]
    out = attack.apply(round_of([[1, 2], [3, 4], [9, 9]], [*honest, bad]), CTX)
    updates = torch.stack([r.upload.values for r in out])
    aggregate = weighted_mean(updates, torch.ones(3))
    assert aggregate.tolist() == pytest.approx([1.0, 1.5])
    big = set_up(IPM(1 / 3, epsilon=3.0), num_clients=3)
    out = big.apply(round_of([[1, 2], [3, 4], [9, 9]], [*honest, bad]), CTX)
    # (2 - 3)/3 · [2, 3]: the mean now points against the honest mean
    reversed_ = weighted_mean(torch.stack([r.upload.values for r in out]), torch.ones(3))
    assert reversed_.tolist() == pytest.approx([-2 / 3, -1.0])


def test_the_median_follows_the_small_copies():
    # honest [1], [2], [3] and two copies of -0.1 · 2 = -0.2: the median of
    # {-0.2, -0.2, 1, 2, 3} is 1, below the honest median 2 (ε = 0.1 pulls it toward the copies)
    attack = set_up(IPM(0.4, epsilon=0.1), num_clients=5)
    bad = sorted(attack.malicious)
    honest = [c for c in range(5) if c not in attack.malicious]
    out = attack.apply(round_of([[1], [2], [3], [7], [7]], [*honest, *bad]), CTX)
    assert [r.upload.values.item() for r in out][3:] == pytest.approx([-0.2, -0.2])
    assert median(torch.stack([r.upload.values for r in out]), torch.ones(5)).item() == 1.0


@pytest.mark.parametrize(
    "options, key",
    [
        ({"epsilon": 0}, "attack.epsilon"),
        ({"epsilon": -0.1}, "attack.epsilon"),
        ({"epsilon": "big"}, "attack.epsilon"),
        ({"knowledge": "some"}, "attack.knowledge"),
        ({"pool_size": 0}, "attack.pool_size"),
    ],
)
def test_bad_options_are_one_line_config_errors(options, key):
    with pytest.raises(ConfigError, match=key) as err:
        IPM(0.2, **options)
    assert "\n" not in str(err.value)


def test_ipm_targets_weight_uploads_only():
    with pytest.raises(ConfigError, match="ipm cannot target"):
        IPM(0.2).check_target(SimpleNamespace(upload_type=Signs, clients_train=True))
    IPM(0.2).check_target(SimpleNamespace(upload_type=Weights, clients_train=True))
