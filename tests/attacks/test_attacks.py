"""Attacks: the malicious set, flags, each attack's success test on constructed updates."""

from __future__ import annotations

import statistics
from functools import partial
from types import SimpleNamespace

import pytest
import torch

from components import with_yaml
from fedexp.aggregators.multikrum import multikrum
from fedexp.attacks import NoAttack
from fedexp.attacks.crafted import (
    LIE,
    AGRTailored,
    MinMax,
    MinSum,
    halving_search,
    krum_selects_all,
    min_max_ok,
    min_sum_ok,
    trimmed_mean_deviation,
)
from fedexp.attacks.label_flip import LabelFlip
from fedexp.attacks.rank_reversal import RankReversal, reversed_consensus
from fedexp.attacks.transform import Scaling, SignFlip
from fedexp.core.cohort import RoundResults
from fedexp.core.types import (
    ClientResult,
    ConfigError,
    Ranking,
    RoundContext,
    Signs,
    Weights,
    malicious_count,
)

SignFlip = with_yaml(SignFlip, "attack", "sign_flip")
NoAttack = with_yaml(NoAttack, "attack", "none")
RankReversal = with_yaml(RankReversal, "attack", "rank_reversal")
LabelFlip = with_yaml(LabelFlip, "attack", "label_flip")
Scaling = with_yaml(Scaling, "attack", "scaling")
LIE = with_yaml(LIE, "attack", "lie")
MinMax = with_yaml(MinMax, "attack", "min_max")
MinSum = with_yaml(MinSum, "attack", "min_sum")
AGRTailored = with_yaml(AGRTailored, "attack", "agr_tailored")

CTX = RoundContext(1, (0, 1, 2, 3), 0)


def setup(attack, num_clients=10, seed=0, aggregator=None):
    attack.setup(SimpleNamespace(seed=seed, aggregator=aggregator), num_clients)
    return attack


def results_of(uploads, ids=None):
    ids = ids if ids is not None else range(len(uploads))
    return RoundResults.of([ClientResult(c, 10, u, 0.0, 1) for c, u in zip(ids, uploads)])


def test_malicious_set_is_a_fraction_of_all_clients_fixed_by_the_seed():
    a, b = setup(SignFlip(0.2)), setup(SignFlip(0.2))
    assert len(a.malicious) == 2 and a.malicious == b.malicious
    assert len(setup(SignFlip(0.25), num_clients=10).malicious) == 2  # int(), as FRL's code
    with pytest.raises(ConfigError, match="attack.fraction"):
        SignFlip(1.0)


def test_apply_flags_and_corrupts_only_malicious_uploads():
    attack = setup(SignFlip(0.2))
    bad = sorted(attack.malicious)
    ids = [bad[0], 99, bad[1]]
    out = attack.apply(results_of([Weights(torch.ones(2))] * 3, ids), CTX)
    assert [r.upload.values.tolist() for r in out] == [[-1, -1], [1, 1], [-1, -1]]
    assert malicious_count(out) == 2
    assert attack.round_metrics(out) == {
        "attack/fraction": 0.2,
        "attack/malicious_in_round": 2,
        "attack/malicious_majority": 1,  # 2 of the 3 sampled clients
    }
    assert NoAttack().round_metrics(out)["attack/fraction"] == 0.0


def test_target_check():
    frl_like = SimpleNamespace(upload_type=Ranking, clients_train=True)
    with pytest.raises(ConfigError, match="sign_flip cannot target"):
        SignFlip().check_target(frl_like)
    RankReversal().check_target(frl_like)
    LabelFlip().check_target(frl_like)  # data poisoning: any algorithm
    with pytest.raises(ConfigError, match="rank_reversal cannot target"):
        RankReversal().check_target(SimpleNamespace(upload_type=Weights, clients_train=True))


def test_sign_flip_on_signs_and_scaling():
    attack = setup(SignFlip(0.5), num_clients=2)
    signs = Signs(torch.tensor([1, -1], dtype=torch.int8))
    bad = min(attack.malicious)
    out = attack.apply(results_of([signs, signs]), CTX)
    assert out[bad].upload.values.tolist() == [-1, 1] and out[bad].upload.values.dtype == torch.int8
    assert out[1 - bad].upload.values.tolist() == [1, -1]
    scaled = setup(Scaling(0.5, factor=10.0), num_clients=2).apply(
        results_of([Weights(torch.tensor([1.0, -2.0]))] * 2), CTX
    )
    assert scaled[bad].upload.values.tolist() == [10.0, -20.0]


def test_rank_reversal_uploads_the_reverse_of_the_attackers_vote():
    # reputations [0,1,2,3] and [1,0,2,3]: sums e0 1, e1 1, e2 4, e3 6 -> highest first, ties
    # in id order: [3, 2, 0, 1]
    rankings = torch.tensor([[0, 1, 2, 3], [1, 0, 2, 3]])
    assert reversed_consensus(rankings).tolist() == [3, 2, 0, 1]
    attack = setup(RankReversal(0.5), num_clients=4)
    out = attack.apply(results_of([Ranking((r,)) for r in rankings], sorted(attack.malicious)), CTX)
    assert all(r.upload.layers[0].tolist() == [3, 2, 0, 1] for r in out)


def test_label_flip_poisons_only_malicious_training_labels():
    y = torch.tensor([0, 3, 9])
    data = SimpleNamespace(
        num_classes=10, train=lambda c: (torch.zeros(3), y), test=lambda c: (0, y)
    )
    attack = setup(LabelFlip(0.5), num_clients=2)
    view = attack.wrap_data(data)
    bad, good = min(attack.malicious), 1 - min(attack.malicious)
    assert view.train(bad)[1].tolist() == [9, 6, 0]
    assert view.train(good)[1].tolist() == [0, 3, 9]
    assert view.test(bad)[1].tolist() == [0, 3, 9] and view.num_classes == 10


def test_halving_search_finds_the_largest_passing_gamma():
    gamma = halving_search(lambda g: g <= 3.0, gamma_init=10.0, tolerance=1e-5)
    assert 3.0 - 1e-4 < gamma <= 3.0
    assert halving_search(lambda g: False, 10.0) == 0.0


def test_agr_tailored_probes_gamma_from_5_as_the_reference_code():
    # FRL's reference code: our_attack_trmean / our_attack_mkrum(threshold=5.0) probe λ = 5, then
    # λ ± λ_fail / 2 with λ_fail = 5 halved after every probe: up on success, down on failure
    attack = AGRTailored(0.2, target="trimmed_mean")
    known = torch.tensor([[0.0], [2.0]])  # ∇_b = 1, std = √2: a probe at γ is 1 − γ·√2
    probes: list[float] = []

    def passes_up_to_6_3(malicious: torch.Tensor) -> bool:
        probes.append(float((1 - malicious[0]) / 2**0.5))
        return probes[-1] <= 6.3

    attack.success_test = lambda known, copies: passes_up_to_6_3
    crafted = attack.craft(known, round_size=5, copies=1)
    # 5 passes (up 2.5), 7.5 fails (down 1.25), 6.25 passes (up 0.625), 6.875 fails ...
    assert probes[:5] == pytest.approx([5.0, 7.5, 6.25, 6.875, 6.5625])
    assert 6.3 - 1e-4 < attack.last_gamma <= 6.3 and max(probes) < 2 * 5.0
    assert float(crafted[0]) == pytest.approx(1 - attack.last_gamma * 2**0.5)


def test_min_max_and_min_sum_success_tests():
    known = torch.tensor([[0.0, 0.0], [2.0, 0.0]])  # max pairwise squared distance 4
    assert min_max_ok(torch.tensor([1.0, 0.0]), known)  # at most 1 from each
    assert not min_max_ok(torch.tensor([1.0, 2.0]), known)  # 5 > 4
    known3 = torch.tensor([[0.0, 0.0], [2.0, 0.0], [0.0, 2.0]])  # min_i sum_j = 8 (row 0)
    assert min_sum_ok(torch.tensor([2 / 3, 2 / 3]), known3)  # 48/9 <= 8
    assert not min_sum_ok(torch.tensor([3.0, 3.0]), known3)  # 38 > 8


def test_multikrum_success_test():
    known = torch.tensor([[0.0], [1.0], [2.0], [3.0], [4.0], [5.0]])
    assert krum_selects_all(torch.tensor([2.5]), known, copies=1)  # central: selected
    assert not krum_selects_all(torch.tensor([100.0]), known, copies=1)


def test_trimmed_mean_deviation():
    known = torch.tensor([[0.0], [2.0], [4.0]])  # mean 2; beta = 1 drops one per side
    assert trimmed_mean_deviation(torch.tensor([-10.0]), known, 1) == 1.0  # keeps 0, 2
    assert trimmed_mean_deviation(torch.tensor([100.0]), known, 1) == 1.0  # keeps 2, 4
    assert trimmed_mean_deviation(torch.tensor([2.0]), known, 1) == 0.0


def test_lie_z_and_update():
    # n = 25, m = 5: s = 13 - 5 = 8, z = Phi^-1(17 / 25)
    assert LIE.z_max(25, 5) == pytest.approx(statistics.NormalDist().inv_cdf(0.68))
    attack = setup(LIE(0.5, z=1.0), num_clients=4)
    uploads = [Weights(torch.tensor([0.0])), Weights(torch.tensor([2.0]))]
    out = attack.apply(results_of(uploads, sorted(attack.malicious)), CTX)
    assert out[0].upload.values.item() == pytest.approx(1 + 2**0.5)


def round_of(n_benign=8, n_bad=2, d=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    uploads = [Weights(torch.randn(d, generator=g) * 0.1 + 1.0) for _ in range(n_benign + n_bad)]
    return results_of(uploads)


@pytest.mark.parametrize("cls", [MinMax, MinSum])
def test_min_max_min_sum_pass_their_test_at_the_gamma_found(cls):
    attack = setup(cls(0.2, knowledge="all", perturbation="unit"))
    results = round_of()
    bad = sorted(attack.malicious)
    ids = [c for c in range(10) if c not in bad] + bad
    results = results_of([r.upload for r in results], ids)
    out = attack.apply(results, CTX)
    crafted = out[-1].upload.values
    known = torch.stack([r.upload.values for r in results])
    test = min_max_ok if cls is MinMax else min_sum_ok
    assert attack.last_gamma > 0 and test(crafted, known)
    assert torch.equal(out[-1].upload.values, out[-2].upload.values)  # one vector for all


def test_agr_tailored_against_multikrum_is_selected():
    attack = setup(
        AGRTailored(0.2, knowledge="all", perturbation="unit"), aggregator=partial(multikrum)
    )
    assert attack.target == "multikrum"
    results = round_of()
    out = attack.apply(results, CTX)
    crafted = [r for r in out if r.malicious][0].upload.values
    known = torch.stack([r.upload.values for r in results])
    assert attack.last_gamma > 0 and krum_selects_all(crafted, known, copies=2)
    assert setup(AGRTailored(0.2)).target == "trimmed_mean"  # auto without a robust aggregator
