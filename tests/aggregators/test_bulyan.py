"""Bulyan on hand-computed numbers and against Flower's `aggregate_bulyan`."""

from __future__ import annotations

import importlib.util
from functools import partial
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from components import with_yaml
from fedexp.aggregators import new_run, run_notes
from fedexp.aggregators.bulyan import bulyan
from fedexp.aggregators.multikrum import krum_select
from fedexp.core.types import ConfigError, Weights
from fedexp.engine.aggregation import check_aggregator

bulyan = with_yaml(bulyan, "aggregator", "bulyan")

# the script that computed FLOWER below; its `case_inputs` makes the inputs here too
SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "reference_bulyan.py"
_spec = importlib.util.spec_from_file_location("reference_bulyan", SCRIPT)
reference = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(reference)

# Flower 1.42.0's aggregate_bulyan(results, f, aggregate_krum, to_keep=0) on
# reference.case_inputs(case, n, f, shift), printed by `PYTHONPATH=<flwr> python
# scripts/reference_bulyan.py`; keys (case, n, f, shift)
FLOWER = {
    (0, 7, 1, 50.0): (-0.07399117782084878, -1.1063743854258614, 2.2645958578259138, -7.570044997364152, 7.994679550840515),  # noqa: E501
    (1, 8, 1, 50.0): (0.3434572443827615, -5.561173756148026, 6.119294924224437, -6.554938362786742, 6.859384665450129),  # noqa: E501
    (2, 11, 2, 50.0): (0.2152474532894956, -4.097195280763372, 0.37022974337016334, -0.7773840348169664, 0.6515007481973375),  # noqa: E501
    (3, 12, 2, 3.0): (2.672113508943066, -4.341792090730397, 1.2660283726101693, 4.158037060755644, -3.241808815005971),  # noqa: E501
    (4, 15, 3, 3.0): (3.2284574399795045, -2.7871633339044988, 4.741072878839048, -5.176414815867368, 4.819786579272196),  # noqa: E501
    (5, 9, 1, 0.0): (-0.41565654263705165, 0.2345447620372454, -0.2229894357914457, 0.40450358740282705, -0.5779215969620772),  # noqa: E501
}  # fmt: skip

A = torch.tensor([[0.0], [2.0], [3.0], [7.0], [8.0], [9.0], [60.0]], dtype=torch.float64)


def test_bulyan_by_hand_in_one_dimension():
    # n = 7, f = 1: theta = 5 by Krum, scores over the n'-f-2 nearest others (squared):
    #   n'=7, 4 nearest: 0 -> 126, 2 -> 66, 3 -> 51, 7 -> 46, 8 -> 63, 9 -> 90, 60 -> ...: 7
    #   n'=6, 3 nearest: 0 -> 77, 2 -> 41, 3 -> 35, 8 -> 62, 9 -> 86: 3
    #   n'=5, 2 nearest: 0 -> 68, 2 -> 40, 8 -> 37, 9 -> 50: 8
    #   n'=4, 1 nearest: 0 -> 4, 2 -> 4, 9 -> 49: a tie, the earlier: 0
    #   n'=3, at least 1: 2 -> 49, 9 -> 49, 60 -> 2601: a tie, the earlier: 2
    assert krum_select(A, 1, 5) == [3, 2, 4, 0, 1]
    # selected {0, 2, 3, 7, 8}, median 3; beta = 3 closest to it: 3, 2, 0 -> 5/3
    out = bulyan(A, torch.ones(7), f=1)
    assert torch.allclose(out, torch.tensor([5.0 / 3.0], dtype=torch.float64), atol=1e-12)
    assert torch.equal(bulyan(A, torch.ones(7), num_malicious=1), out)  # f: known
    # the mean (89/7), Multi-Krum's and the median (7) are elsewhere; f = 0 is the plain mean
    assert torch.allclose(bulyan(A, torch.ones(7), f=0), A.mean(0))


def test_the_coordinate_phase_keeps_the_values_nearest_the_median_per_coordinate():
    # n = 7, f = 1, both coordinates as the 1-D case, the second mirrored: the same updates
    # are selected (distances unchanged), each coordinate keeps its own nearest three
    two = torch.cat([A, -A], dim=1)
    out = bulyan(two, torch.ones(7), f=1)
    assert torch.allclose(out, torch.tensor([5.0 / 3.0, -5.0 / 3.0], dtype=torch.float64))


@pytest.mark.parametrize("key", list(FLOWER), ids=lambda k: f"n{k[1]}-f{k[2]}-shift{k[3]:g}")
def test_bulyan_equals_flowers_numbers(key):
    case, n, f, shift = key
    x = torch.from_numpy(reference.case_inputs(case, n, f, shift))
    out = bulyan(x, torch.ones(n, dtype=torch.float64), f=f)
    expected = torch.tensor(FLOWER[key], dtype=torch.float64)
    assert torch.allclose(out, expected, rtol=0, atol=1e-12), (out, expected)


def test_bulyan_equals_flower_run_here():
    pytest.importorskip("flwr.server.strategy.aggregate")
    for case, (n, f, shift) in enumerate(reference.CASES):
        x = reference.case_inputs(case, n, f, shift)
        theirs = torch.from_numpy(reference.flower_bulyan(x, f))
        ours = bulyan(torch.from_numpy(x), torch.ones(n, dtype=torch.float64), f=f)
        assert torch.allclose(ours, theirs, rtol=0, atol=1e-12), (n, f)


def test_known_is_capped_at_n_minus_3_over_4_with_a_warning(caplog):
    new_run()
    six = A[:6]
    with caplog.at_level("WARNING", logger="fedexp.aggregators"):
        out = bulyan(six, torch.ones(6), num_malicious=1)  # 6 < 4 + 3: f = 0, the mean
    assert torch.allclose(out, six.mean(0))
    assert "aggregator.f: 1 of 6 uploads is more than Bulyan allows" in caplog.text
    # logged once, counted each time: the run's warnings say in how many aggregations
    bulyan(six, torch.ones(6), num_malicious=2)
    assert caplog.text.count("more than Bulyan allows") == 1
    (note,) = run_notes()
    assert note.startswith("aggregator.f: 1 of 6 uploads") and "first of 2 aggregations" in note
    new_run()  # the next run starts with none
    assert run_notes() == []
    # 7 uploads, 2 malicious: f = 1
    assert torch.equal(bulyan(A, torch.ones(7), num_malicious=2), bulyan(A, torch.ones(7), f=1))


class _Vectors:
    upload_type = Weights
    aggregator_inputs = ()


@pytest.mark.parametrize("f", [-1, 0.25, 0.3, "some", True])
def test_bad_f_is_refused_in_one_line(f):
    with pytest.raises(ConfigError, match=r"^aggregator\.f: must be 'known'") as err:
        check_aggregator(partial(bulyan.__wrapped__, f=f), _Vectors())
    assert "\n" not in str(err.value)


def test_a_fixed_f_is_checked_against_the_round_before_training():
    check = bulyan.__wrapped__.check_config
    cfg = OmegaConf.create({"clients_per_round": 6, "aggregator": {"f": 1}})
    with pytest.raises(ConfigError) as err:
        check(cfg)
    assert str(err.value) == (
        "aggregator.f: 1 means 1 malicious of the 6 uploads of a round (clients_per_round=6); "
        "Bulyan needs clients_per_round >= 4f + 3 = 7"
    )
    check(OmegaConf.create({"clients_per_round": 7, "aggregator": {"f": 1}}))
    check(OmegaConf.create({"clients_per_round": 3, "aggregator": {"f": "known"}}))
    # a fraction: int(0.2 x 6) = 1 of 6 -> refused; of 11 -> 2, 11 >= 11
    with pytest.raises(ConfigError, match="Bulyan needs"):
        check(OmegaConf.create({"clients_per_round": 6, "aggregator": {"f": 0.2}}))
    check(OmegaConf.create({"clients_per_round": 11, "aggregator": {"f": 0.2}}))
    assert bulyan.__wrapped__.min_uploads(f=2) == (
        11,
        "aggregator.f=2 was capped (Bulyan needs n >= 11)",
    )
    assert bulyan.__wrapped__.min_uploads(f="known") is None
